#include "kernels/cuda/small_gemv.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColsPerWarp = 2;
constexpr int kColsPerBlock = kWarps * kColsPerWarp;
constexpr int kUnroll = 8;  // 16-byte chunks per lane and column in flight

int MaxBlocks() { return 2 * CurrentDeviceMultiprocessors(); }

__device__ __forceinline__ float Dot8(uint4 w, const float* x) {
  const float4 x0 = *reinterpret_cast<const float4*>(x);
  const float4 x1 = *reinterpret_cast<const float4*>(x + 4);
  __nv_bfloat162 b[4];
  memcpy(b, &w, sizeof(w));
  const float2 w0 = __bfloat1622float2(b[0]), w1 = __bfloat1622float2(b[1]);
  const float2 w2 = __bfloat1622float2(b[2]), w3 = __bfloat1622float2(b[3]);
  float s = x0.x * w0.x;
  s = fmaf(x0.y, w0.y, s);
  s = fmaf(x0.z, w1.x, s);
  s = fmaf(x0.w, w1.y, s);
  s = fmaf(x1.x, w2.x, s);
  s = fmaf(x1.y, w2.y, s);
  s = fmaf(x1.z, w3.x, s);
  s = fmaf(x1.w, w3.y, s);
  return s;
}

// This warp's weight chunks of one pass: columns col0 .. col0 + kColsPerWarp - 1, chunks
// base + u * 32 + lane. Coherent loads (internal::LoadWeight) at clamped addresses, so
// that the first pass can be issued before the grid dependency wait; zero past the row.
__device__ __forceinline__ void LoadPass(const SmallGemvParams& p, int col0, int base,
                                         uint4 (&wv)[kColsPerWarp][kUnroll]) {
  const int lane = threadIdx.x % 32;
  const int chunks = p.k / 8;
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
    const uint4* row = reinterpret_cast<const uint4*>(p.w + static_cast<int64_t>(min(col0 + c, p.n - 1)) * p.k);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ch = base + u * 32 + lane;
      const uint4 v = internal::LoadWeight(row + min(ch, chunks - 1));
      wv[c][u] = ch < chunks ? v : make_uint4(0, 0, 0, 0);
    }
  }
}

// A running arg-max (internal::Better's order, NaN skipped): best value and column.
struct Best {
  float v = 0.0f;
  int i = INT_MAX;
  __device__ __forceinline__ void Offer(float ov, int oi) {
    if (oi != INT_MAX && !isnan(ov) && internal::Better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
};

// One warp's kColsPerWarp output columns from col0 on, x (normalized) in shared memory;
// with `preloaded` the first pass's weights are already in wv. best[m]: the running
// arg-max of row m over the columns this thread stored.
template <int M>
__device__ __forceinline__ void ColumnBlock(const SmallGemvParams& p, const float* xs, int col0, bool preloaded,
                                            uint4 (&wv)[kColsPerWarp][kUnroll], Best (&best)[M]) {
  const int lane = threadIdx.x % 32;
  const int chunks = p.k / 8;
  float acc[kColsPerWarp][M];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[c][m] = 0.0f;
  for (int base = 0; base < chunks; base += 32 * kUnroll) {
    if (!preloaded || base > 0) LoadPass(p, col0, base, wv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ch = base + u * 32 + lane;
      if (ch < chunks) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float* x = xs + m * p.k + ch * 8;
#pragma unroll
          for (int c = 0; c < kColsPerWarp; ++c) acc[c][m] += Dot8(wv[c][u], x);
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float s = internal::WarpSum(acc[c][m]);
      const int col = col0 + c;
      if (lane == c * M + m && col < p.n && m < p.rows) {
        float* o = p.out + static_cast<int64_t>(m) * p.ldo + col;
        const float v = p.accumulate ? *o + s : s;
        *o = v;
        best[m].Offer(v, col);
      }
    }
  }
}

constexpr int kNormPre = 8;  // norm weights per thread held in registers (k <= 2048)

// The arg-max of the launch: each block's best per row into the scratch, then the last
// block's over the blocks' (Better is a total order: the result does not depend on which
// block finishes last).
template <int M>
__device__ __forceinline__ void ArgmaxEpilogue(const SmallGemvParams& p, Best (&best)[M]) {
  __shared__ float red_v[kWarps][M];
  __shared__ int red_i[kWarps][M];
  __shared__ bool last_block;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch_v = static_cast<float*>(p.argmax_scratch);                           // [grid][M]
  int* scratch_i = reinterpret_cast<int*>(scratch_v + gridDim.x * kSmallGemvMaxRows);  // [grid][M]
  const auto reduce_block = [&](Best (&b)[M]) {  // block-wide; the result in thread 0's b
#pragma unroll
    for (int m = 0; m < M; ++m) {
      for (int offset = 16; offset > 0; offset /= 2) {
        b[m].Offer(__shfl_xor_sync(0xffffffffu, b[m].v, offset), __shfl_xor_sync(0xffffffffu, b[m].i, offset));
      }
      if (lane == 0) {
        red_v[warp][m] = b[m].v;
        red_i[warp][m] = b[m].i;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        b[m] = Best{};
        for (int w = 0; w < kWarps; ++w) b[m].Offer(red_v[w][m], red_i[w][m]);
      }
    }
  };
  reduce_block(best);
  if (threadIdx.x == 0) {  // the block's partials, then one release for them
#pragma unroll
    for (int m = 0; m < M; ++m) {
      scratch_v[blockIdx.x * kSmallGemvMaxRows + m] = best[m].v;
      scratch_i[blockIdx.x * kSmallGemvMaxRows + m] = best[m].i;
    }
    unsigned prev;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(prev) : "l"(p.argmax_counter) : "memory");
    last_block = prev == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  Best all[M];
  for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += kThreads) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      all[m].Offer(__ldcg(scratch_v + b * kSmallGemvMaxRows + m), __ldcg(scratch_i + b * kSmallGemvMaxRows + m));
    }
  }
  __syncthreads();  // red_v / red_i reused
  reduce_block(all);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < p.rows) p.argmax[m] = all[m].i == INT_MAX ? 0 : all[m].i;
    }
    *p.argmax_counter = 0u;  // every block has counted: ready for the next launch
  }
}

// Grid: at most a few blocks per multiprocessor, each looping over column blocks of
// kColsPerBlock columns after one pass over x. The first column block's first pass of
// weights (all of it up to k = 2048) and this thread's norm weights are loaded before the
// wait, into registers: after it, one round trip for x and none for the weights.
template <int M>
__global__ void __launch_bounds__(kThreads) SmallGemvKernel(SmallGemvParams p) {
  extern __shared__ __align__(16) float xs[];  // [M][k], normalized
  __shared__ float red[kWarps][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col_blocks = (p.n + kColsPerBlock - 1) / kColsPerBlock;
  uint4 wv[kColsPerWarp][kUnroll];
  LoadPass(p, blockIdx.x * kColsPerBlock + warp * kColsPerWarp, 0, wv);
  float nw[kNormPre];
  if (p.norm_weight != nullptr) {
#pragma unroll
    for (int j = 0; j < kNormPre; ++j) nw[j] = internal::LoadWeight(p.norm_weight + min(threadIdx.x + j * kThreads, p.k - 1));
  }
  if (p.k > 32 * kUnroll * 8) {
    // The rest of the first column block's weights into L2.
    const int n0 = blockIdx.x * kColsPerBlock;
    for (int c = 0; c < kColsPerBlock && n0 + c < p.n; ++c) {
      const __nv_bfloat16* row = p.w + static_cast<int64_t>(n0 + c) * p.k + 32 * kUnroll * 8;
      internal::PrefetchRangeL2(row, static_cast<int64_t>(p.k - 32 * kUnroll * 8) * 2);
    }
  }
  internal::WaitAndTrigger();

  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    ss[m] = 0.0f;
    if (m < p.rows) {
      const float* x = p.x + static_cast<int64_t>(p.x_rows != nullptr ? p.x_rows[m] : m) * p.ldx;
      for (int i = threadIdx.x; i < p.k; i += kThreads) {
        const float v = x[i];
        xs[m * p.k + i] = v;
        ss[m] += v * v;
      }
    } else {
      for (int i = threadIdx.x; i < p.k; i += kThreads) xs[m * p.k + i] = 0.0f;
    }
  }
  if (p.norm_weight != nullptr) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float s = internal::WarpSum(ss[m]);
      if (lane == 0) red[warp][m] = s;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += red[w][m];
      const float inv = rsqrtf(total / static_cast<float>(p.k) + p.norm_eps);
      // Each thread rescales the elements it stored itself.
#pragma unroll
      for (int j = 0; j < kNormPre; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < p.k) xs[m * p.k + i] = nw[j] * (xs[m * p.k + i] * inv);
      }
      for (int i = threadIdx.x + kNormPre * kThreads; i < p.k; i += kThreads) {
        xs[m * p.k + i] = p.norm_weight[i] * (xs[m * p.k + i] * inv);
      }
    }
  }
  __syncthreads();

  Best best[M];
  for (int cb = blockIdx.x; cb < col_blocks; cb += gridDim.x) {
    ColumnBlock<M>(p, xs, cb * kColsPerBlock + warp * kColsPerWarp, cb == static_cast<int>(blockIdx.x), wv, best);
  }
  if (p.argmax != nullptr) ArgmaxEpilogue<M>(p, best);
}

template <int M>
cudaError_t LaunchGemv(const SmallGemvParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(M) * p.k * sizeof(float);
  static std::atomic<size_t> configured{0};  // the kernel's dynamic shared memory limit, raised as needed
  if (smem > configured.load(std::memory_order_relaxed)) {
    const cudaError_t e =
        cudaFuncSetAttribute(SmallGemvKernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured.store(smem, std::memory_order_relaxed);
  }
  const int col_blocks = (p.n + kColsPerBlock - 1) / kColsPerBlock;
  const unsigned blocks = static_cast<unsigned>(std::min(col_blocks, MaxBlocks()));
  return internal::Launch(SmallGemvKernel<M>, dim3(blocks), dim3(kThreads), smem, stream, p);
}

}  // namespace

size_t SmallGemvArgmaxScratchBytes() {
  return static_cast<size_t>(MaxBlocks()) * kSmallGemvMaxRows * (sizeof(float) + sizeof(int));
}

cudaError_t SmallGemv(const SmallGemvParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.w == nullptr || p.out == nullptr || p.rows < 0 || p.rows > kSmallGemvMaxRows ||
      p.n <= 0 || p.k <= 0 || p.k % 8 != 0 || p.ldx < p.k || p.ldo < p.n ||
      reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || static_cast<int64_t>(kSmallGemvMaxRows) * p.k * 4 > 200 * 1024 ||
      (p.argmax != nullptr && (p.argmax_scratch == nullptr || p.argmax_counter == nullptr))) {
    return cudaErrorInvalidValue;
  }
  switch (p.rows) {
    case 1: return LaunchGemv<1>(p, stream);
    case 2: return LaunchGemv<2>(p, stream);
    default: return LaunchGemv<4>(p, stream);
  }
}

}  // namespace tandem::cuda
