#!/usr/bin/env bash
# The components whose threads Tandem synchronizes itself, under ThreadSanitizer: a
# CPU-only build in build-tsan (TANDEM_TSAN=ON: every object instrumented, ccache as for
# build/) of the `tsan`-labelled tests: the router's request core (its serial executors,
# timers and sinks on real threads, with fake replicas), the engine's KV waiter queue, the
# replica registry, the kvstore's block store, the transfer layer in one
# process, the router's metrics history, the decode replica's prober of quarantined
# leases' writers (its timers and answers on other threads), the CPU kernels' thread pool (its
# job hand-over through atomics), token masks filled on that pool (matchers sharing a compiled
# grammar). Every process writes its reports under
# build-tsan/tsan-reports; any report fails the run (0 reports is the bar).
#   scripts/tsan.sh            (scripts/test.sh runs it after ctest)
# Not the real binaries: Debian's gRPC is not instrumented, and the synchronization that
# orders its callbacks happens inside libgrpc, where TSAN cannot see it (a run of the
# serving test under TSAN: 889 reports, all in grpcpp's templates). scripts/tsan.supp
# names the few reports from inside uninstrumented libraries, with the reason for each.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_TSAN_BUILD_DIR:-$root/build-tsan}"
cmake -S "$root" -B "$build" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_TSAN=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=(services_router_replica_registry_test services_router_metrics_history_test
         services_kvstore_core_test
         services_transfer_test
         services_api_request_core_test engine_runtime_kv_wait_test
         services_decode_kv_writer_prober_test kernels_cpu_thread_pool_test
         engine_grammar_matcher_threads_test)
echo "tsan.sh: building ${#targets[@]} targets with ThreadSanitizer in $build"
start=$(date +%s)
cmake --build "$build" --target "${targets[@]}"
echo "tsan.sh: built in $(( $(date +%s) - start )) s"
reports="$build/tsan-reports"
rm -rf "$reports"
mkdir -p "$reports"
# Some kernels randomize mmap more than TSAN's shadow layout allows ("unexpected memory
# mapping"): run without address randomization then.
runner=()
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ] && command -v setarch >/dev/null; then
  runner=(setarch "$(uname -m)" -R)
fi
start=$(date +%s)
# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm) intercept the madvise of an exiting
# thread's stack after TSAN has torn the thread down, and TSAN crashes in their lock.
UCX_MEM_EVENTS=no TSAN_OPTIONS="log_path=$reports/report second_deadlock_stack=1 history_size=4 allocator_may_return_null=1 suppressions=$root/scripts/tsan.supp" \
  "${runner[@]}" ctest --test-dir "$build" -L tsan --output-on-failure --timeout 1800 || status=$?
echo "tsan.sh: tests ran in $(( $(date +%s) - start )) s"
shopt -s nullglob
found=("$reports"/report.*)
if [ ${#found[@]} -gt 0 ]; then
  echo "tsan.sh: ${#found[@]} process(es) reported races:"
  for f in "${found[@]}"; do echo "== $f"; cat "$f"; done
  exit 1
fi
echo "tsan.sh: no ThreadSanitizer reports"
exit "${status:-0}"
