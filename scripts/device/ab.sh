#!/usr/bin/env bash
# A/B of two builds of one benchmark on the device machine: runs A, B, A, B (ROUNDS pairs,
# default 2) with the same arguments on the same GPU, so that the comparison does not span
# machines (H100s differ by a few percent, and a change of a few percent is what an A/B is
# for). Prints the lines matching SHOW (default: step times and kernel timeline rows) of
# each run; the whole output goes to $OUT/ab_<name>_<i>.log.
#   Here:  cp build/bin/cuda_model_bench /tmp/ab/before; (change, rebuild)
#          cp build/bin/cuda_model_bench /tmp/ab/after
#          scripts/device/pack.sh /tmp/ab/before /tmp/ab/after &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/ab.sh before after --config bench/configs/deepseek_v2_lite_fp8.json \
#            --batches 1,4 --context 1024 --steps 32 --default-only --timeline --prefill 0
#          (run tool: carry .carry/device.tgz)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
a=$1 b=$2
shift 2
show="${SHOW:-decode batch|experts gate|experts down|context|of the copy|weights on}"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
rc=0
for ((i = 1; i <= ${ROUNDS:-2}; ++i)); do
  for name in "$a" "$b"; do
    echo "== $name ($i)"
    log="$out/ab_${name}_$i.log"
    timeout "${TIMEOUT:-200}" "$bin/$name" "$@" >"$log" 2>&1 || { echo "$name exited $?"; rc=1; }
    grep -E "$show" "$log" | grep -v '^ *"' | head -"${LINES_PER_RUN:-24}"
  done
done
exit $rc
