#!/usr/bin/env bash
# DeepSeek-V4 GPU decode at V4-Flash's widths (issue 22): v4_cuda_decode_bench on synthetic
# weights (bench/configs/v4_flash_widths.json, LAYERS layers, default 8; LAYERS=fit: as many
# as the GPU holds beside the head and the KV pool, the acceptance's setting) at 1K, 32K and 128K
# tokens of context, batch 1, against the same run's device copy, with CUDA graphs and
# without (--eager-too). JSON under $OUT.
#   Here:  scripts/device/pack.sh build/bin/v4_cuda_decode_bench [...] &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/v4_decode_bench.sh   (run tool: carry .carry/device.tgz)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
# shellcheck source=check.sh
source "$root/scripts/device/check.sh"
SHOW='context|weights on|model:|finite' check v4_decode "$bin/v4_cuda_decode_bench" \
  --layers "${LAYERS:-8}" --contexts "${CONTEXTS:-1024,32768,131072}" --steps "${STEPS:-24}" --eager-too ${BENCH_ARGS:-} \
  --json "$out/v4_cuda_decode_bench.json"
finish
