#!/usr/bin/env bash
# Before/after benchmarks of two builds on the H200 machine, interleaved in one run (run
# tool, kind nvidia-h200, carry .carry/ab.tgz): the CUDA forward pass of DeepSeek-V2-Lite
# (cuda_model_bench, default path) and CPU decode at batch 1 of a V2 0.6B-shaped model
# (cpu_decode_bench; build B also with TANDEM_CPU_SPIN_US=0, its thread pool as A's), and
# build B's V4 CPU decode. JSON in $OUT/engine_ab.tgz (A/, B/). Here first, for builds A and B:
#   PACK_DEST=/tmp/pk/A scripts/device/pack.sh A/build/bin/{cuda_model_bench,cpu_decode_bench}
#   PACK_DEST=/tmp/pk/B scripts/device/pack.sh build/bin/{cuda_model_bench,cpu_decode_bench,v4_cpu_decode_bench,tandem}
#   tar -czf .carry/ab.tgz -C /tmp/pk A B
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp}"
mkdir -p "$out/A" "$out/B" /tmp/ab
tar -xzf "$root/.carry/ab.tgz" -C /tmp/ab
run() { local b="$1"; shift; LD_LIBRARY_PATH="/tmp/ab/$b/lib" "$@"; }
threads="${AB_THREADS:-8}"
run B /tmp/ab/B/bin/tandem make-model --config "$root/bench/configs/cpu_decode_0p6b.json" --out /tmp/ab/v2cpu \
  --generated-tokenizer >/dev/null || exit 1
run B /tmp/ab/B/bin/tandem make-model --config "$root/bench/configs/v4_cpu_decode_0p5b.json" --out /tmp/ab/v4cpu \
  --generated-tokenizer >/dev/null || exit 1
summary() { python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
if 'step_ms' in d: print(sys.argv[1], 'p50 %.2f ms' % d['step_ms']['p50'], 'fraction %.3f' % d['fraction_of_read_roofline'], 'ref %.1f GB/s' % d['reference_read_bandwidth_gbs'])
else:
  for c in d.get('decode', [])[:8]: print(sys.argv[1], json.dumps(c)[:300])
" "$1" 2>&1 | head -12; }
for i in 1 2; do
  for b in A B; do
    timeout 200 env LD_LIBRARY_PATH="/tmp/ab/$b/lib" /tmp/ab/$b/bin/cuda_model_bench \
      --config "$root/bench/configs/deepseek_v2_lite_full.json" --default-only --json "$out/$b/cuda_model_$i.json" \
      > "$out/$b/cuda_model_$i.log" 2>&1
    echo "== $b cuda_model_bench run $i: rc $?"; grep -E "^decode|^prefill" "$out/$b/cuda_model_$i.log" | head -8
  done
  for b in A B; do
    run "$b" timeout 120 /tmp/ab/$b/bin/cpu_decode_bench --model /tmp/ab/v2cpu --threads "$threads" \
      --json "$out/$b/cpu_decode_$i.json" > /dev/null 2>&1
    summary "$out/$b/cpu_decode_$i.json"
  done
  TANDEM_CPU_SPIN_US=0 run B timeout 120 /tmp/ab/B/bin/cpu_decode_bench --model /tmp/ab/v2cpu --threads "$threads" \
    --json "$out/B/cpu_decode_nospin_$i.json" > /dev/null 2>&1
  summary "$out/B/cpu_decode_nospin_$i.json"
  run B timeout 120 /tmp/ab/B/bin/v4_cpu_decode_bench --model /tmp/ab/v4cpu --threads "$threads" \
    --json "$out/B/v4_cpu_decode_$i.json" > /dev/null 2>&1
  summary "$out/B/v4_cpu_decode_$i.json"
done
# One file back (the run tool returns only a few).
tar -czf "$out/engine_ab.tgz" -C "$out" A B && rm -rf "$out/A" "$out/B"
