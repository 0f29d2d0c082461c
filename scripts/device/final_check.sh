#!/usr/bin/env bash
# One device run after CUDA kernel work (run tool, kind nvidia-h200; carry .carry/perf.tgz
# .carry/device.tgz .carry/e2e): every single-GPU kernel/model/engine test, compute-sanitizer
# memcheck on the decode-path kernels, the GPU serving test twice (with `serving` as the first
# argument), then the full cuda_model_bench (JSON + console under $OUT). Exits 1 when any step
# failed (a test, a memcheck error, every case of a binary skipped, a timeout, the benchmark),
# after a summary of every step (scripts/device/check.sh; whole logs in $OUT/device_logs.tgz).
# Here first:
#   scripts/device/gpu_serving.sh pack
#   PACK_DEST=$PWD/.carry/perf scripts/device/pack.sh build/bin/cuda_model_bench \
#     build/tests/kernels_cuda_{ops,moe_expert_gemv,mla_attention}_test \
#     build/tests/engine_model_cuda_deepseek_model_test
#   tar czf .carry/perf.tgz -C .carry perf && rm -rf .carry/perf
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp}"
export DEVICE_LOGS="${DEVICE_LOGS:-/tmp/device-logs}"
. "$root/scripts/device/check.sh"
[ -d "$root/.carry/perf" ] || tar -xzf "$root/.carry/perf.tgz" -C "$root/.carry"
bin="$root/.carry/perf/bin"
perf_lib="$root/.carry/perf/lib"
with_perf() { LD_LIBRARY_PATH="$perf_lib" "$@"; }

for t in kernels_cuda_ops_test kernels_cuda_moe_expert_gemv_test kernels_cuda_mla_attention_test \
         engine_model_cuda_deepseek_model_test; do
  if [ ! -x "$bin/$t" ]; then results+=("FAILED  $t (not packed)"); failed=1; continue; fi
  SHOW='^\[ *(FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|prompts:' check "$t" with_perf timeout 300 "$bin/$t"
done
memcheck() {  # memcheck NAME BINARY FILTER
  check "$1" with_perf timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin/$2" --gtest_filter="$3"
  expect_in "$1" "ERROR SUMMARY: 0 errors"
}
# Routing, permutation, GEMVs, MLA prepare and decode.
memcheck memcheck_ops kernels_cuda_ops_test '*MoeFused*:*MoeRouting*:*MoePermute*:*SmallGemv*:*MlaPrepare*:*MlaDecodeFused*'
memcheck memcheck_mla kernels_cuda_mla_attention_test '*DecodeOtherBlockSizes*:*DecodeCaptures*:*DecodeRejects*'
memcheck memcheck_moe_expert_gemv kernels_cuda_moe_expert_gemv_test '*Graph*:*Staged*:*Rejects*:*Early*'

# The engine on CUDA, KV block copy, CUDA IPC (its own steps and summary in its log).
SHOW='^(ok|FAILED) ' check gpu_serving_tests "$root/scripts/device/gpu_serving.sh" run tests
if [ "${1:-}" = serving ]; then
  for i in 1 2; do
    SHOW='^(ok|FAILED) |^request|differ' check "gpu_serving_run_$i" "$root/scripts/device/gpu_serving.sh" run serving
  done
fi
SHOW='^decode|^prefill|^references' check cuda_model_bench with_perf timeout 400 "$bin/cuda_model_bench" \
  --config "$root/bench/configs/deepseek_v2_lite_full.json" --timeline --json "$out/cuda_model_h200.json"
cp "$logs/cuda_model_bench.log" "$out/cuda_model_h200_timeline.txt" 2>/dev/null
[ -s "$out/cuda_model_h200.json" ] || { results+=("FAILED  cuda_model_bench (no JSON)"); failed=1; }
finish
