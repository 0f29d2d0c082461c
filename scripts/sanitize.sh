#!/usr/bin/env bash
# The engine's own tests under AddressSanitizer + UndefinedBehaviorSanitizer, CPU-only
# engine build in build-asan: the pipelined steps keep raw pointers to sequences across
# steps (engine.h InFlight), and a use after free there passes silently elsewhere.
#   scripts/sanitize.sh           (scripts/test.sh runs it after ctest; TANDEM_SKIP_SANITIZE=1 skips)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${TANDEM_ASAN_BUILD_DIR:-$root/build-asan}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_ENGINE_ONLY=ON -DTANDEM_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
echo "sanitize.sh: building engine_runtime_engine_test, engine_runtime_engine_v4_test and engine_runtime_speculative_test with ASan + UBSan in $build"
cmake --build "$build" --target engine_runtime_engine_test engine_runtime_engine_v4_test engine_runtime_speculative_test
echo "sanitize.sh: running them (the pipelined cases; DeepSeek-V4's paged pool, slots, export and import; verify chunks, draft passes and the spans into sequences they keep)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$build/tests/engine_runtime_engine_test" --gtest_filter='EnginePipelineTest.*:*/Pipelined' --gtest_brief=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$build/tests/engine_runtime_engine_v4_test" --gtest_brief=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$build/tests/engine_runtime_speculative_test" --gtest_brief=1

# The prefill replica's checks of forged destination and descriptor messages, and the
# transfer layer's bounds (tests/unit/services/prefill/kv_destination_fuzz_test.cc): a
# services build, but only that test's few sources (the transfer layer, no engine, no gRPC).
services_build="${TANDEM_ASAN_SERVICES_BUILD_DIR:-$root/build-asan-services}"
cmake -S "$root" -B "$services_build" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
echo "sanitize.sh: building services_prefill_kv_destination_fuzz_test with ASan + UBSan in $services_build"
cmake --build "$services_build" --target services_prefill_kv_destination_fuzz_test
echo "sanitize.sh: running it (forged destinations and descriptors)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$services_build/tests/services_prefill_kv_destination_fuzz_test" --gtest_brief=1
