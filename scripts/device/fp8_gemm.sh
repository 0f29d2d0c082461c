#!/usr/bin/env bash
# On the device: the block-scaled FP8 GEMM's kernel test (and memcheck on its small
# cases), its benchmark against cuBLASLt FP8 and cuBLAS bf16, the CUDA model's FP8 tests
# (FP8 prefill among them), and DeepSeek-V2-Lite-shaped FP8 prefill with the FP8 GEMMs
# against the bf16 copies, same run. JSON into $OUT.
# Pack first (here): scripts/device/pack.sh build/tests/kernels_cuda_fp8_gemm_test \
#   build/bin/fp8_gemm_bench build/tests/engine_model_cuda_fp8_decode_test build/bin/cuda_model_bench
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 180 "$bin/kernels_cuda_fp8_gemm_test" 2>&1 | grep -v '^\[ RUN\|^\[       OK' | tail -30
timeout 240 compute-sanitizer --tool memcheck "$bin/kernels_cuda_fp8_gemm_test" \
  --gtest_filter='*Quantize*:*SmallInteger*/0:*SmallInteger*/3:*Grouped*/0:*Grouped*/1:*Refuses*' 2>&1 | tail -4
timeout 300 "$bin/fp8_gemm_bench" --json "$out/fp8_gemm_bench.json" 2>&1 | grep -v '^{'
[ -x "$bin/engine_model_cuda_fp8_decode_test" ] &&
  timeout 240 "$bin/engine_model_cuda_fp8_decode_test" 2>&1 | grep -E 'FAILED|PASSED|prefill|Failure|error' | head -20
[ -x "$bin/cuda_model_bench" ] &&
  timeout 300 "$bin/cuda_model_bench" --config "$root/bench/configs/deepseek_v2_lite_fp8.json" --batches 1 \
    --context 1024 --prefill 8192 --default-only --json "$out/cuda_model_bench_v2_lite_fp8_prefill.json" 2>&1 |
  grep -E '^prefill|^batch|references|ready'
exit 0
