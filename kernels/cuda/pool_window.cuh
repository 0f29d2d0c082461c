// The per-channel arithmetic of a compressor window, shared by pool_window.cu and
// v4_compressor.cu so both keep the CPU's order (engine/model/deepseek_v4/v4_math.cc
// PoolWindow): the max of the gates, the sum of exp(g - max) in slot order, then
// sum_s kv_s * (exp(g_s - max) / sum) in slot order (exp evaluated again rather than
// kept, as there). The weighted sum is one fma per slot: GCC contracts the CPU's
// `acc += kv * w` into vfmadd231ss under the project's default -march=x86-64-v3 (seen in
// v4_math.cc.o's disassembly); a CPU build without FMA rounds the product first and
// differs in the last bit.
#pragma once

#include <cuda_runtime.h>

namespace tandem::cuda::internal {

// gate(s) and kv(s): slot s's (biased) gate and kv value of the channel.
template <typename Gate, typename Kv>
__device__ __forceinline__ float PoolSlots(int slots, Gate gate, Kv kv) {
  float m = -INFINITY;
  for (int s = 0; s < slots; ++s) m = fmaxf(m, gate(s));
  float sum = 0.0f;
  for (int s = 0; s < slots; ++s) sum = __fadd_rn(sum, expf(gate(s) - m));
  float acc = 0.0f;
  for (int s = 0; s < slots; ++s) acc = fmaf(kv(s), __fdiv_rn(expf(gate(s) - m), sum), acc);
  return acc;
}

}  // namespace tandem::cuda::internal
