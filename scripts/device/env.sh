#!/usr/bin/env bash
# Runs a binary packed by pack.sh with the packed libraries: env.sh NAME ARGS...
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export LD_LIBRARY_PATH="$root/.carry/device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
name="$1"; shift
exec "$root/.carry/device/bin/$name" "$@"
