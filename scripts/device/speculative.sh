#!/usr/bin/env bash
# Speculative decoding with the MTP layer on the GPU (issue 25), in one device run: the
# new kernels' tests (the decode kernel's kv_offset, DraftChoice), the MTP layer against the
# CPU and the generated construction against its checkpoint, the engine's speculative GPU
# tests, the existing GPU model and engine tests (regressions), then speculative_bench on
# a DeepSeek-V2-Lite-shaped make-model --mtp-acceptance model (weights generated on the GPU
# at load) at P 0.6 / 0.75 / 0.9 and batches 1 / 16 / 64, drafts against none in one process.
#   Here:  scripts/device/pack.sh build/bin/speculative_bench build/tests/<the tests below> &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/speculative.sh   (run tool: carry .carry/device.tgz; JSON under $OUT)
#   SKIP_TESTS=1 runs the benchmark only; BENCH=0 the tests only; NEW_ONLY=1 skips the
#   existing GPU model and engine tests.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
export TANDEM_CACHE_DIR=/tmp/tc TANDEM_SOURCE_DIR="$root"
# shellcheck source=check.sh
source "$root/scripts/device/check.sh"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  check kv_offset "$bin/kernels_cuda_mla_attention_test" --gtest_filter='*KvOffset*:*DecodeMatchesCpuAbsorbed*'
  check draft_choice "$bin/kernels_cuda_ops_test" --gtest_filter='*DraftChoice*:*EmbeddingArgmax*'
  SHOW='^\[ *(FAILED|PASSED) |Failure|Expected|MTP slots|draft [0-9]' check cuda_mtp "$bin/engine_model_cuda_mtp_test"
  SHOW='^\[ *(FAILED|PASSED) |Failure|Expected|GPU, ' check engine_spec "$bin/engine_runtime_engine_cuda_speculative_test"
  if [ "${NEW_ONLY:-0}" != 1 ]; then
    check cuda_model "$bin/engine_model_cuda_deepseek_model_test"
    check engine_cuda "$bin/engine_runtime_engine_cuda_test"
  fi
fi
if [ "${BENCH:-1}" != 0 ]; then
  SHOW='tokens/s|speedup|acceptance' check bench "$bin/speculative_bench" \
    --config "$root/bench/configs/deepseek_v2_lite_mtp.json" --device cuda \
    --acceptance "${ACCEPTANCE:-0.6,0.75,0.9}" --batches "${BATCHES:-1,16,64}" --drafts "${DRAFTS:-3}" \
    --prompt 64 --output "${OUTPUT_TOKENS:-256}" --json "$out/speculative_bench.json"
fi
finish
