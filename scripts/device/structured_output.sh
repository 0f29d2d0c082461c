#!/usr/bin/env bash
# Structured output's cost on the GPU, in one device run: a DeepSeek-V2-Lite-shaped random
# model (weights generated on the GPU at load), structured_output_bench's closed loops of
# 64 streams under the JSON schema corpus then unconstrained with the same output
# lengths, in one process; before it, the engine's CUDA test of constrained rows.
#   Here:  scripts/device/pack.sh build/bin/structured_output_bench build/bin/tandem \
#            build/tests/engine_runtime_engine_cuda_test &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/structured_output.sh   (run tool: carry .carry/device.tgz; JSON under $OUT)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
# The engine's constrained rows on the GPU give the host path's tokens.
TANDEM_CACHE_DIR=/tmp/tc "$bin/engine_runtime_engine_cuda_test" \
  --gtest_filter='*Constrained*:*DeviceSamplingGivesTheHostSamplersTokens*:*PipelinedSteps*' || exit 1
"$bin/tandem" make-model --config "$root/bench/configs/deepseek_v2_lite_full.json" --weights-on-gpu --out /tmp/v2lite \
  > /dev/null || exit 1
for streams in ${STREAMS:-64}; do
  "$bin/structured_output_bench" --model /tmp/v2lite --device cuda --streams "$streams" --prompt 128 --output 128 \
    --seconds "${SECONDS_PER_PHASE:-20}" --schemas "$root/tests/goldens/json_schemas/corpus.json" \
    --json "$out/structured_output_h200_s$streams.json" || exit 1
done
