#!/usr/bin/env bash
# One device run after CUDA kernel work (run tool, kind nvidia-h200; carry .carry/perf.tgz
# .carry/device.tgz .carry/e2e): every single-GPU kernel/model/engine test, compute-sanitizer
# memcheck on the decode-path kernels, the GPU serving test twice (with `serving` as the first
# argument), then the full cuda_model_bench (JSON + console under $OUT). Here first:
#   scripts/device/gpu_serving.sh pack
#   PACK_DEST=$PWD/.carry/perf scripts/device/pack.sh build/bin/cuda_model_bench \
#     build/tests/kernels_cuda_{ops,moe_expert_gemv,mla_attention}_test \
#     build/tests/engine_model_cuda_deepseek_model_test
#   tar czf .carry/perf.tgz -C .carry perf && rm -rf .carry/perf
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp}"
[ -d "$root/.carry/perf" ] || tar -xzf "$root/.carry/perf.tgz" -C "$root/.carry"
bin="$root/.carry/perf/bin"
summary() { grep -E "^\[ *(FAILED|PASSED)|Failure|Expected|Which is|prompts:|ERROR SUMMARY" | head -20; }
(
  export LD_LIBRARY_PATH="$root/.carry/perf/lib"
  for t in kernels_cuda_ops_test kernels_cuda_moe_expert_gemv_test kernels_cuda_mla_attention_test \
           engine_model_cuda_deepseek_model_test; do
    [ -x "$bin/$t" ] || continue
    echo "== $t"; timeout 300 "$bin/$t" 2>&1 | summary
  done
  echo "== memcheck: routing, permutation, GEMVs, MLA prepare and decode"
  timeout 300 compute-sanitizer --tool memcheck "$bin/kernels_cuda_ops_test" \
    --gtest_filter='*MoeFused*:*MoeRouting*:*MoePermute*:*SmallGemv*:*MlaPrepare*:*MlaDecodeFused*' 2>&1 | summary
  timeout 300 compute-sanitizer --tool memcheck "$bin/kernels_cuda_mla_attention_test" \
    --gtest_filter='*DecodeOtherBlockSizes*:*DecodeCaptures*:*DecodeRejects*' 2>&1 | summary
  timeout 300 compute-sanitizer --tool memcheck "$bin/kernels_cuda_moe_expert_gemv_test" \
    --gtest_filter='*Graph*:*Staged*:*Rejects*:*Early*' 2>&1 | summary
)
echo "== engine on CUDA, KV block copy, CUDA IPC"
"$root/scripts/device/gpu_serving.sh" run tests 2>&1 | tail -25
if [ "${1:-}" = serving ]; then
  for i in 1 2; do
    echo "== GPU serving, run $i"
    "$root/scripts/device/gpu_serving.sh" run serving 2>&1 | tail -8
  done
fi
echo "== cuda_model_bench"
LD_LIBRARY_PATH="$root/.carry/perf/lib" timeout 400 "$bin/cuda_model_bench" \
  --config "$root/bench/configs/deepseek_v2_lite_full.json" --timeline --json "$out/cuda_model_h200.json" \
  > "$out/cuda_model_h200_timeline.txt" 2>&1
grep -E "^decode|^prefill|^references" "$out/cuda_model_h200_timeline.txt"
