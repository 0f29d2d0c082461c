#!/usr/bin/env bash
# Configures (once) and builds Tandem with CMake + Ninja (+ ccache when present).
#   scripts/build.sh [extra cmake -D options...]
# Build directory: $TANDEM_BUILD_DIR, default build/ in the repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_BUILD_DIR:-$root/build}"
if [ ! -f "$build/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S "$root" -B "$build" -G Ninja "$@"
fi
cmake --build "$build" -j "$(nproc)"
