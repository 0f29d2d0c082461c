#!/usr/bin/env bash
# Where a DeepSeek-V4 GPU decode step's time goes (issue 22): one step of
# v4_cuda_decode_bench (--profile brackets it) under nsys when the machine has it (each
# kernel's GPU time and the CUDA API's host time), else under ncu (each kernel's GPU time).
# The per-kernel table and the raw report land under $OUT.
#   Here:  scripts/device/pack.sh build/bin/v4_cuda_decode_bench &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: LAYERS=2 CONTEXT=1024 scripts/device/v4_decode_profile.sh   (run tool: carry .carry/device.tgz)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
args=(--layers "${LAYERS:-2}" --contexts "${CONTEXT:-1024}" --steps 4 --profile)
nsys_bin=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$nsys_bin" ]; then
  "$nsys_bin" profile --capture-range=cudaProfilerApi --capture-range-end=stop -o "$out/v4_step" --force-overwrite true \
    "$bin/v4_cuda_decode_bench" "${args[@]}" >"$out/bench.log" 2>&1
  "$nsys_bin" stats --report cuda_gpu_kern_sum --report cuda_api_sum --format csv -o "$out/v4_step" "$out/v4_step.nsys-rep" \
    >/dev/null 2>&1
  for f in "$out"/v4_step_*.csv; do echo "== $f"; head -40 "$f"; done
else
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  "$ncu_bin" --profile-from-start off --metrics gpu__time_duration.sum --csv \
    "$bin/v4_cuda_decode_bench" "${args[@]}" >"$out/ncu.csv" 2>"$out/bench.log"
  # kernel name -> launches, total microseconds
  python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; name_i = head.index("Kernel Name"); val_i = head.index("Metric Value"); unit_i = head.index("Metric Unit")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    v = float(r[val_i].replace(",", "")); u = r[unit_i]
    v = v / 1000 if u in ("nsecond", "ns") else (v * 1000 if u in ("msecond", "ms") else v)
    k = r[name_i].split("(")[0][:70]; agg[k][0] += 1; agg[k][1] += v
total = sum(a[1] for a in agg.values())
print(f"kernels {sum(a[0] for a in agg.values())}, GPU time {total:.1f} us")
for k, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{us:9.1f} us {n:4d} x  {k}")
PY
fi
grep -E "context|model:" "$out/bench.log"
