#!/usr/bin/env bash
# V2/V3 FP8 checkpoints' decode on their FP8 forms (issue 22): the GPU test against the CPU
# engine and the bf16 copies (also under memcheck), and cuda_model_bench at DeepSeek-V2-Lite's
# shapes in FP8 (bench/configs/deepseek_v2_lite_fp8.json, generated on the GPU): batch 1
# and 4 on the FP8 forms against the bf16 copies in the same run, and the greedy closeness
# check. JSON under $OUT.
#   Here:  scripts/device/pack.sh build/tests/engine_model_cuda_fp8_decode_test build/bin/cuda_model_bench &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/fp8_decode.sh   (run tool: carry .carry/device.tgz)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
# shellcheck source=check.sh
source "$root/scripts/device/check.sh"
SHOW='^\[ *(FAILED|PASSED) |Failure|Expected|Which is|decode rows|greedy|parts at' \
  check fp8_decode "$bin/engine_model_cuda_fp8_decode_test"
if [ "${MEMCHECK:-1}" = 1 ]; then
  check memcheck_fp8_decode timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bin/engine_model_cuda_fp8_decode_test" --gtest_filter='*/0:CudaFp8Generated*'
  expect_in memcheck_fp8_decode "ERROR SUMMARY: 0 errors"
fi
SHOW='references|on cuda|decode batch|FP8|closeness' check v2_lite_fp8 timeout 400 "$bin/cuda_model_bench" \
  --config bench/configs/deepseek_v2_lite_fp8.json --batches "${BATCHES:-1,4}" --context "${CONTEXT:-1024}" \
  --steps 32 --default-only ${BENCH_ARGS:-} --json "$out/cuda_model_bench_v2_lite_fp8.json"
finish
