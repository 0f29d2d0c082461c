#include "kernels/cuda/v4_compressor.h"

#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/pool_window.cuh"

namespace tandem::cuda {
namespace {

constexpr int kEmitThreads = 256;
constexpr int kEmitWarps = kEmitThreads / 32;
constexpr int kCopyThreads = 128;

// One block per window: the pooled entry stays in shared memory (width floats) through the
// norm and the rope, so each value is written once.
__global__ void CompressorEmitKernel(CompressorEmitParams p) {
  extern __shared__ float entry[];
  __shared__ double partial[kEmitWarps];
  internal::WaitAndTrigger();
  const int64_t w = blockIdx.x;
  float* out = p.out[w];
  if (out == nullptr) return;
  const int n = p.num_slots[w];
  if (n < 1 || n > p.max_slots) {
    for (int64_t c = threadIdx.x; c < p.width; c += kEmitThreads) out[c] = NAN;
    return;
  }
  const CompressorSlot* slots = p.slots + w * p.max_slots;
  double squares = 0.0;
  for (int64_t c = threadIdx.x; c < p.width; c += kEmitThreads) {
    const float v = internal::PoolSlots(
        n,
        [&](int s) {
          const CompressorSlot& slot = slots[s];
          return slot.bias == nullptr ? slot.gate[c] : __fadd_rn(slot.gate[c], slot.bias[c]);
        },
        [&](int s) { return slots[s].kv[c]; });
    entry[c] = v;
    // Exact in double (a float square has 48 significant bits), so only the order of the
    // double additions differs from the CPU's loop, which almost never shows in the float
    // variance.
    squares += static_cast<double>(v) * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = squares;
  __syncthreads();
  double sum = 0.0;
  for (int i = 0; i < kEmitWarps; ++i) sum += partial[i];
  // cpu::RmsNorm's expressions: the variance rounded to float, then 1 / sqrt in float.
  const float variance = static_cast<float>(sum / static_cast<double>(p.width));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, p.eps)));
  const int64_t rope_from = p.width - p.rope_dim;
  for (int64_t c = threadIdx.x; c < p.width; c += kEmitThreads) {
    const float y = __fmul_rn(p.norm[c], __fmul_rn(entry[c], inv));
    if (c < rope_from) {
      out[c] = y;
    } else {
      entry[c] = y;  // the rope pairs read both halves below
    }
  }
  __syncthreads();
  const int half = p.rope_dim / 2;
  const int64_t position = p.positions[w];
  for (int i = threadIdx.x; i < half; i += kEmitThreads) {
    float cs, sn;
    internal::RopeCosSin(position, p.inv_freq[i], p.attention_factor, &cs, &sn);
    const float x0 = entry[rope_from + 2 * i], x1 = entry[rope_from + 2 * i + 1];
    // cpu::ApplyRope as GCC compiles it for x86-64-v3 (vmulss, then vfmsub231ss /
    // vfmadd132ss): the sin product rounded, the cos product fused.
    out[rope_from + 2 * i] = fmaf(x0, cs, -__fmul_rn(x1, sn));
    out[rope_from + 2 * i + 1] = fmaf(x1, cs, __fmul_rn(x0, sn));
  }
}

// Grid (rows, channel blocks): rows are the many (a pass's carried rows), widths small.
__global__ void CopyRowsKernel(CopyRowsParams p) {
  internal::WaitAndTrigger();
  const int64_t r = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kCopyThreads + threadIdx.x;
  const float* src = p.src[r];
  float* dst = p.dst[r];
  if (c >= p.width || src == nullptr || dst == nullptr) return;
  const float* bias = p.bias == nullptr ? nullptr : p.bias[r];
  dst[c] = bias == nullptr ? src[c] : __fadd_rn(src[c], bias[c]);
}

}  // namespace

cudaError_t CompressorEmit(const CompressorEmitParams& p, cudaStream_t stream) {
  if (p.windows == 0) return cudaSuccess;
  if (p.slots == nullptr || p.num_slots == nullptr || p.norm == nullptr || p.positions == nullptr ||
      p.out == nullptr || p.max_slots < 1 || p.max_slots > 1024 || p.windows < 0 || p.windows > 0x7fffffff ||
      p.width < 1 || p.width > kMaxCompressorWidth || p.rope_dim < 0 || p.rope_dim % 2 != 0 ||
      p.rope_dim > 256 || p.rope_dim > p.width || (p.rope_dim > 0 && p.inv_freq == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = static_cast<size_t>(p.width) * sizeof(float);
  return internal::Launch(CompressorEmitKernel, dim3(static_cast<unsigned>(p.windows)), dim3(kEmitThreads), smem,
                          stream, p);
}

cudaError_t CopyRows(const CopyRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.width == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr || p.rows < 0 || p.rows > 0x7fffffff || p.width < 0 ||
      p.width > int64_t{65535} * kCopyThreads) {
    return cudaErrorInvalidValue;
  }
  return internal::Launch(CopyRowsKernel,
                          dim3(static_cast<unsigned>(p.rows),
                               static_cast<unsigned>((p.width + kCopyThreads - 1) / kCopyThreads)),
                          dim3(kCopyThreads), 0, stream, p);
}

}  // namespace tandem::cuda
