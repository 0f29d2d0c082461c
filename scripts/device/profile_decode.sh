#!/usr/bin/env bash
# Where a decode step's GPU time goes, on the device machine: nsys's per-kernel summary of
# one graph-replayed V4 decode step (v4_cuda_decode_bench --profile, LAYERS layers at 1K
# context; graph nodes traced one by one), and ncu's view of the FP8 expert GEMV of a
# V2-Lite-shaped FP8 decode step (MoeExpertGemvKernel on FP8 weights: speed of light,
# occupancy, warp stall reasons, pipe utilization), and the same of the routed FP4 GEMV of
# V4-Flash's experts (quantized_gemv_bench). Output under $OUT: v4_kernels*.csv,
# fp8_expert_gemv_ncu.txt, fp4_expert_gemv_ncu.txt.
#   Here:  scripts/device/pack.sh build/bin/v4_cuda_decode_bench build/bin/cuda_model_bench \
#            build/bin/quantized_gemv_bench &&
#          tar -czf .carry/device.tgz -C .carry device && rm -rf .carry/device
#   There: scripts/device/profile_decode.sh [v4|fp8|fp4|all]   (run tool: carry .carry/device.tgz)
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
# ncu_kernel NAME REGEX SKIP COMMAND...: the sections that say what bounds a kernel (speed of
# light, the pipes' utilization, stall reasons, occupancy) for two launches, into $out/NAME.txt.
ncu_kernel() {
  local name=$1 regex=$2 skip=$3; shift 3
  if [ -z "$ncu_bin" ]; then
    echo "profile_decode: no ncu on this machine" >&2
    rc=1
    return
  fi
  timeout 400 "$ncu_bin" --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip "$skip" \
    --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis --metrics \
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_fp16_cycles_active.avg.pct_of_peak_sustained_active \
    "$@" >"$out/$name.txt" 2>&1 || rc=1
  grep -E "Kernel|  [A-Z].*Kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|pipe_|Stall|stall" \
    "$out/$name.txt" | head -50
}
if [ "$what" = all ] || [ "$what" = fp8 ]; then
  # V2-Lite FP8's expert GEMV (FP8 weights, one token).
  ncu_kernel fp8_expert_gemv_ncu "MoeExpertGemvKernel<.int.1, .bool.1>" 40 "$bin/cuda_model_bench" \
    --config bench/configs/deepseek_v2_lite_fp8.json --batches 1 --context 1024 --steps 16 --default-only --prefill 0
fi
if [ "$what" = all ] || [ "$what" = fp4 ]; then
  # V4-Flash's routed FP4 experts, one token (QuantizedGemv's expert tiles).
  ncu_kernel fp4_expert_gemv_ncu "Fp4ExpertGemvKernel<.int.16>" 10 "$bin/quantized_gemv_bench" --iters 20
fi
exit $rc
