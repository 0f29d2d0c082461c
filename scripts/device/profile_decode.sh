#!/usr/bin/env bash
# Where a decode step's GPU time goes, on the device machine: nsys's per-kernel summary of
# one graph-replayed V4 decode step (v4_cuda_decode_bench --profile, LAYERS layers at 1K
# context; graph nodes traced one by one), and ncu's view of the FP8 expert GEMV of a
# V2-Lite-shaped FP8 decode step (MoeExpertGemvKernel on FP8 weights: speed of light,
# occupancy, warp stall reasons). Output under $OUT: v4_kernels.csv, fp8_expert_gemv_ncu.txt.
#   Here:  scripts/device/pack.sh build/bin/v4_cuda_decode_bench build/bin/cuda_model_bench &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/profile_decode.sh [v4|fp8|all]   (run tool: carry .carry/device.tgz)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=carried.sh
source "$root/scripts/device/carried.sh"
out="${OUT:-/tmp}"
cd "$root" || exit 1
what="${1:-all}"
nsys_bin="$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)"
ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
rc=0
if [ "$what" = all ] || [ "$what" = v4 ]; then
  if [ -z "$nsys_bin" ]; then
    echo "profile_decode: no nsys on this machine" >&2
    rc=1
  else
    timeout 300 "$nsys_bin" profile --capture-range=cudaProfilerApi --cuda-graph-trace=node -o /tmp/v4prof \
      --force-overwrite true "$bin/v4_cuda_decode_bench" --layers "${LAYERS:-4}" --contexts 1024 --steps 8 --profile \
      >/tmp/v4prof.log 2>&1 || { tail -20 /tmp/v4prof.log; rc=1; }
    grep -E "context" /tmp/v4prof.log
    "$nsys_bin" stats --report cuda_gpu_kern_sum --format csv --output "$out/v4_kernels" /tmp/v4prof.nsys-rep >/dev/null 2>&1
    ls "$out"/v4_kernels*.csv >/dev/null 2>&1 && head -30 "$out"/v4_kernels*.csv | cut -c1-200
  fi
fi
if [ "$what" = all ] || [ "$what" = fp8 ]; then
  if [ -z "$ncu_bin" ]; then
    echo "profile_decode: no ncu on this machine" >&2
    rc=1
  else
    timeout 400 "$ncu_bin" --kernel-name-base demangled --kernel-name "regex:MoeExpertGemvKernel<.int.1, .bool.1>" \
      --launch-skip 40 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis \
      "$bin/cuda_model_bench" --config bench/configs/deepseek_v2_lite_fp8.json --batches 1 --context 1024 \
      --steps 16 --default-only --prefill 0 >"$out/fp8_expert_gemv_ncu.txt" 2>&1 || rc=1
    grep -E "MoeExpertGemvKernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers|Stall|Issue Slots|Executed Ipc" \
      "$out/fp8_expert_gemv_ncu.txt" | head -60
  fi
fi
exit $rc
