#!/usr/bin/env bash
# On the device: DeepSeek-V4's FP8 products on the FP8 tensor cores at prefill (issue 22):
# the CUDA V4 model's tests (Fp8GemmPrefillMatchesTheCpuWithTheSameRounding among them),
# then v4_cuda_decode_bench --prefill at V4-Flash's widths (LAYERS layers, default 4),
# FP8 GEMMs against float32 and against cuBLASLt's FP8 rate, same run. JSON into $OUT.
# Pack first (here): scripts/device/pack.sh build/tests/engine_model_v4_cuda_model_test \
#   build/bin/v4_cuda_decode_bench
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
[ -x "$bin/engine_model_v4_cuda_model_test" ] &&
  timeout 300 "$bin/engine_model_v4_cuda_model_test" 2>&1 | grep -E 'FAILED|PASSED|prefill of|Failure|error|Expected|Which is|actual' | head -30
timeout 400 "$bin/v4_cuda_decode_bench" --layers "${LAYERS:-4}" --contexts 1024 --steps 8 \
  --prefill "${PREFILL:-8192}" ${CHUNK:+--prefill-chunk $CHUNK} --json "$out/v4_cuda_prefill.json" 2>&1 |
  grep -E '^prefill|^context|weights on|model:|error|v4_cuda'
exit 0
