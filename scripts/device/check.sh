# Sourced by the device scripts: runs their steps, keeps each step's whole output, prints
# the lines that matter, and ends with a summary and an exit status that says whether
# anything failed.
#   check NAME COMMAND...   runs COMMAND; its output goes to $logs/NAME.log. It failed when
#                           it exits non-zero: a test binary's failure, 77 when every case of
#                           a GPU test binary skipped (tests/support/gpu_test_main.h: on the
#                           device the GPU must be usable), a timeout (124), a sanitizer's
#                           error exit, a benchmark that did not finish.
#   SHOW=REGEX check ...    prints the lines of the output matching REGEX (default: gtest's
#                           results, failures and expectations).
#   expect_in NAME REGEX    fails NAME's step unless its output has a line matching REGEX
#                           (e.g. compute-sanitizer's "ERROR SUMMARY: 0 errors").
#   finish                  prints every step's result, packs the logs into
#                           $OUT/device_logs.tgz and exits 1 if any step failed, else 0.
logs="${DEVICE_LOGS:-/tmp/device-logs}"
mkdir -p "$logs"
results=()
failed=0
default_show='^\[ *(FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|ERROR SUMMARY|Skipped'

check() {
  local name=$1; shift
  local log="$logs/$name.log"
  echo "== $name"
  "$@" >"$log" 2>&1
  local rc=$?
  grep -E "${SHOW:-$default_show}" "$log" | head -40
  if [ $rc -eq 0 ]; then
    results+=("ok      $name")
  else
    local why="exit $rc"
    [ $rc -eq 77 ] && why="exit 77: every case skipped (no usable GPU?)"
    [ $rc -eq 124 ] && why="timed out"
    results+=("FAILED  $name ($why; $log)")
    failed=1
    tail -15 "$log"
  fi
  return $rc
}

expect_in() {
  local name=$1 regex=$2
  if ! grep -qE "$regex" "$logs/$name.log" 2>/dev/null; then
    results+=("FAILED  $name (no line matching '$regex')")
    failed=1
  fi
}

finish() {
  echo "== summary"
  printf '%s\n' "${results[@]}"
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then tar -czf "$OUT/device_logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"; fi
  if [ $failed -ne 0 ]; then echo "== FAILED: see the steps above"; exit 1; fi
  echo "== all passed"
  exit 0
}
