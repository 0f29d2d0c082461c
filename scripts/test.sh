#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test with ctest, then
# (without ctest options) the engine's tests under ASan + UBSan (scripts/sanitize.sh;
# TANDEM_SKIP_SANITIZE=1 skips them) and the components that synchronize their own
# threads under ThreadSanitizer (scripts/tsan.sh, its own build in build-tsan;
# TANDEM_TSAN=0 skips it).
#   scripts/test.sh [ctest options...]      e.g. scripts/test.sh -L unit
# Labels: unit, integration, gpu (GPU tests: one ctest test per case, each skipped with a
# reason where there is no GPU), tsan (the subset scripts/tsan.sh runs under
# ThreadSanitizer in build-tsan).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_BUILD_DIR:-$root/build}"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure --timeout 900 "$@"
if [ $# -eq 0 ] && [ "${TANDEM_SKIP_SANITIZE:-0}" != 1 ]; then
  "$root/scripts/sanitize.sh"
fi
if [ $# -eq 0 ] && [ "${TANDEM_TSAN:-1}" != 0 ]; then
  "$root/scripts/tsan.sh"
fi
