#!/usr/bin/env bash
# scripts/device/carried.sh on a warm device machine: the carried binaries are unpacked
# again when the archive changed (a call must never run the previous call's binaries), and
# left as they are when it did not.
set -euo pipefail
carried="$(cd "$(dirname "$0")/../../.." && pwd)/scripts/device/carried.sh"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
pack() {  # pack VALUE: an archive whose device/bin/tool prints VALUE
  local staging="$root/staging"
  rm -rf "$staging" && mkdir -p "$staging/device/bin" "$staging/device/lib"
  echo "$1" >"$staging/device/bin/tool"
  mkdir -p "$root/.carry" && tar -czf "$root/.carry/device.tgz" -C "$staging" device
}
fail() { echo "carried_test: $*" >&2; exit 1; }

pack first
# shellcheck source=/dev/null
source "$carried"
[ "$(cat "$bin/tool")" = first ] || fail "first archive not unpacked"
[ "$LD_LIBRARY_PATH" = "$root/.carry/device/lib" ] || fail "LD_LIBRARY_PATH is $LD_LIBRARY_PATH"

touch "$root/.carry/device/kept"  # the same archive again: nothing unpacked
# shellcheck source=/dev/null
source "$carried"
[ -e "$root/.carry/device/kept" ] || fail "unchanged archive unpacked again"

pack second  # a new archive on the warm machine
# shellcheck source=/dev/null
source "$carried"
[ "$(cat "$bin/tool")" = second ] || fail "changed archive not unpacked: $(cat "$bin/tool")"
[ ! -e "$root/.carry/device/kept" ] || fail "the previous archive's files were kept"
echo "carried_test: ok"
