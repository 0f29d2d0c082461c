#!/usr/bin/env bash
# DeepSeek-V4 on the GPU (issue 22), in one device run: each V4 kernel's test against the
# CPU engine's arithmetic and the same under compute-sanitizer memcheck (with the FP8/FP4
# GEMV and its benchmark against a same-run copy), then the GPU model
# against the CPU engine (engine_model_v4_cuda_model_test, also under memcheck) and the
# engine on the GPU (engine_runtime_engine_v4_cuda_test); REGRESSIONS=1 adds the V2/V3 GPU
# model and engine tests (the kernels they share: rope, pool_window, sink attention).
#   Here:  scripts/device/pack.sh build/tests/kernels_cuda_{hyper_connections,v4_moe_routing,\
#            sink_attention,v4_ops,v4_compressor,v4_key_select,quantized_gemv}_test build/bin/quantized_gemv_bench \
#            build/tests/engine_model_v4_cuda_model_test build/tests/engine_runtime_engine_v4_cuda_test \
#            build/tests/kernels_cuda_ops_test \
#            [build/tests/engine_model_cuda_deepseek_model_test build/tests/engine_runtime_engine_cuda_test] &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/v4_kernels.sh   (run tool: carry .carry/device.tgz; logs under $OUT)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
export TANDEM_CACHE_DIR=/tmp/tc TANDEM_SOURCE_DIR="$root"
# shellcheck source=check.sh
source "$root/scripts/device/check.sh"
# KERNELS="a b" limits the kernel tests to those named (a short run after one kernel changed).
for t in ${KERNELS:-hyper_connections v4_moe_routing sink_attention v4_ops v4_compressor v4_key_select quantized_gemv}; do
  check "$t" "$bin/kernels_cuda_${t}_test"
  check "memcheck_$t" compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/kernels_cuda_${t}_test"
  expect_in "memcheck_$t" "ERROR SUMMARY: 0 errors"
done
if [ -x "$bin/kernels_cuda_ops_test" ]; then  # the FP8 widening the V4 model's GEMMs use
  check convert "$bin/kernels_cuda_ops_test" --gtest_filter='*Convert*'
fi
SHOW='^\[ *(FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|rows |greedy' check v4_model "$bin/engine_model_v4_cuda_model_test"
if [ "${MEMCHECK_MODEL:-1}" = 1 ]; then  # MEMCHECK_MODEL=0: a short run
  check memcheck_v4_model timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/engine_model_v4_cuda_model_test"
  expect_in memcheck_v4_model "ERROR SUMMARY: 0 errors"
fi
check v4_engine "$bin/engine_runtime_engine_v4_cuda_test"
if [ -x "$bin/quantized_gemv_bench" ]; then
  SHOW='GB/s|copy_gbs' check gemv_bench "$bin/quantized_gemv_bench" --json "${OUT:-/tmp}/quantized_gemv_bench.json"
fi
if [ "${REGRESSIONS:-0}" = 1 ]; then
  check cuda_model timeout 120 "$bin/engine_model_cuda_deepseek_model_test"
  check engine_cuda timeout 150 "$bin/engine_runtime_engine_cuda_test"
fi
finish
