#!/usr/bin/env bash
# --batch-invariant on the GPU, in one device run: the engine's CUDA batch-invariance test
# (tiny model), then batch_invariance_bench on a DeepSeek-V2-Lite-shaped random model
# (weights generated on the GPU at load; the wgmma decode kernel): bitwise checks among 63
# companions and 64-stream throughput, default then invariant, in one process.
#   Here:  scripts/device/pack.sh build/bin/batch_invariance_bench build/bin/tandem \
#            build/tests/engine_runtime_engine_cuda_batch_invariance_test &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/batch_invariance.sh   (run tool: carry .carry/device.tgz; JSON under $OUT)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
TANDEM_CACHE_DIR=/tmp/tc "$bin/engine_runtime_engine_cuda_batch_invariance_test" || exit 1
"$bin/tandem" make-model --config "$root/bench/configs/deepseek_v2_lite_full.json" --weights-on-gpu --out /tmp/v2lite \
  > /dev/null || exit 1
"$bin/batch_invariance_bench" --model /tmp/v2lite --device cuda --streams "${STREAMS:-64}" --prompt 128 --output 128 \
  --seconds "${SECONDS_PER_PHASE:-20}" --json "$out/batch_invariance_h200_s${STREAMS:-64}.json"
