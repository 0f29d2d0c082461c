#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test with ctest.
#   scripts/test.sh [ctest options...]      e.g. scripts/test.sh -L unit
# Labels: unit, integration, gpu (GPU tests skip with a reason where there is no GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure --timeout 900 "$@"
