#include "kernels/cuda/grouped_gemm.h"

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps, 16 output columns each
constexpr int kBlockN = 64;
constexpr int kBlockK = 64;  // one 128-byte row of 8 16-byte chunks per tile row
// Pipeline depth: deeper for small row tiles, whose stages are small (more weight bytes in
// flight per multiprocessor at decode sizes).
template <int kMTiles>
constexpr int Stages() {
  return kMTiles == 1 ? 6 : kMTiles == 2 ? 5 : 4;
}

template <int kMTiles, bool kSplitA>
constexpr int SmemBytes() {
  return Stages<kMTiles>() * ((kSplitA ? 2 : 1) * kMTiles * 16 + kBlockN) * kBlockK * 2;
}

// Element offset of 16-byte chunk `chunk` of `row` in a [rows][64] bf16 tile, XOR-swizzled
// so that ldmatrix's 8 row addresses hit 8 different bank groups.
__device__ __forceinline__ int Swizzle(int row, int chunk) { return row * kBlockK + ((chunk ^ (row & 7)) * 8); }

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t* r, const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void Mma(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void AtomicAdd2(float* dst, float v0, float v1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(v0, v1));
#else
  atomicAdd(dst, v0);
  atomicAdd(dst + 1, v1);
#endif
}

template <int kMTiles, bool kSplitA>
__global__ void __launch_bounds__(kThreads) GroupedGemmKernel(GroupedGemmParams p) {
  constexpr int kBlockM = kMTiles * 16;
  constexpr int kStages = Stages<kMTiles>();
  constexpr int kATiles = kSplitA ? 2 : 1;  // A, then its remainder
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  constexpr int kStageElems = (kATiles * kBlockM + kBlockN) * kBlockK;
  const int k_tiles = (p.k + kBlockK - 1) / kBlockK;
  const int tiles_per_split = (k_tiles + p.split_k - 1) / p.split_k;
  const int split = p.split_k > 1 ? static_cast<int>(blockIdx.z) : 0;
  const int kt_begin = split * tiles_per_split;
  const int kt_end = min(kt_begin + tiles_per_split, k_tiles);
  const int n0 = blockIdx.x * kBlockN;

  // A dense layer's weights do not depend on earlier kernels: pull this block's into L2
  // while the previous kernel finishes (programmatic dependent launch).
  if (p.group_offsets == nullptr && kt_begin < kt_end) {
    const int64_t k0 = static_cast<int64_t>(kt_begin) * kBlockK;
    const int64_t bytes = (min(static_cast<int64_t>(kt_end) * kBlockK, static_cast<int64_t>(p.k)) - k0) * 2;
    const int rows = min(kBlockN, p.n - n0);
    const int lines = static_cast<int>((bytes + 127) / 128);
    for (int i = threadIdx.x; i < rows * lines; i += kThreads) {
      internal::PrefetchL2(reinterpret_cast<const char*>(p.b + static_cast<int64_t>(n0 + i / lines) * p.k + k0) +
                           static_cast<int64_t>(i % lines) * 128);
    }
  }
  internal::WaitAndTrigger();

  // Which group and rows this block works on.
  int group = 0, row_begin = 0, row_end = p.num_rows;
  if (p.tile_group != nullptr) {
    if (static_cast<int>(blockIdx.y) >= *p.num_tiles) return;
    group = p.tile_group[blockIdx.y];
    row_begin = p.tile_row[blockIdx.y];
    row_end = min(row_begin + kBlockM, p.group_offsets[group + 1]);
  } else if (p.group_offsets != nullptr) {
    if (p.active_groups != nullptr) {
      if (static_cast<int>(blockIdx.y) >= *p.num_active) return;
      group = p.active_groups[blockIdx.y];
    } else {
      group = blockIdx.y;
    }
    row_begin = p.group_offsets[group];
    row_end = p.group_offsets[group + 1];
  }
  if (row_begin >= row_end) return;
  const int chunk0 = p.split_k > 1 ? 0 : static_cast<int>(blockIdx.z);
  const int chunk_step = p.split_k > 1 ? 1 : p.m_chunks;
  if (kt_begin >= kt_end) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const __nv_bfloat16* b = p.b + static_cast<int64_t>(group) * p.b_group_stride;

  for (int m0 = row_begin + chunk0 * kBlockM; m0 < row_end; m0 += chunk_step * kBlockM) {
    // A row (in A) of each tile row this thread loads, resolved once per chunk.
    int a_row[kMTiles];
    bool a_valid[kMTiles];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
      const int r = (tid + i * kThreads) / 8;
      const int row = m0 + r;
      a_valid[i] = row < row_end;
      a_row[i] = a_valid[i] ? (p.a_rows != nullptr ? p.a_rows[row] : row) : 0;
    }
    auto load_stage = [&](int stage, int kt) {
      __nv_bfloat16* sa = smem + stage * kStageElems;
      __nv_bfloat16* sb = sa + kATiles * kBlockM * kBlockK;
      const int k0 = kt * kBlockK;
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const int idx = tid + i * kThreads;
        const int r = idx / 8, c = idx % 8;
        const int kk = k0 + c * 8;
        const bool valid = a_valid[i] && kk < p.k;
        const int64_t offset = valid ? static_cast<int64_t>(a_row[i]) * p.lda + kk : 0;
        CpAsync16(sa + Swizzle(r, c), p.a + offset, valid);
        if constexpr (kSplitA) CpAsync16(sa + kBlockM * kBlockK + Swizzle(r, c), p.a_lo + offset, valid);
      }
#pragma unroll
      for (int i = 0; i < kBlockN * 8 / kThreads; ++i) {
        const int idx = tid + i * kThreads;
        const int r = idx / 8, c = idx % 8;
        const int n = n0 + r, kk = k0 + c * 8;
        const bool valid = n < p.n && kk < p.k;
        const __nv_bfloat16* src = valid ? b + static_cast<int64_t>(n) * p.k + kk : b;
        CpAsync16(sb + Swizzle(r, c), src, valid);
      }
    };

    float acc[kMTiles][2][4];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
      CpAsyncCommit();
    }
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      CpAsyncWait<kStages - 2>();
      __syncthreads();
      const int i = kt - kt_begin;
      const __nv_bfloat16* sa = smem + (i % kStages) * kStageElems;
      const __nv_bfloat16* sb = sa + kATiles * kBlockM * kBlockK;
#pragma unroll
      for (int ks = 0; ks < kBlockK / 16; ++ks) {
        uint32_t bf[4];
        {
          const int j = lane / 8;
          const int n = warp * 16 + (j / 2) * 8 + lane % 8;
          Ldmatrix4(bf, sb + Swizzle(n, 2 * ks + (j % 2)));
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if (m0 + mt * 16 >= row_end) continue;  // warp-uniform: rows past the group
          uint32_t af[4];
          const int a_off = Swizzle(mt * 16 + (lane & 15), 2 * ks + (lane >> 4));
          Ldmatrix4(af, sa + a_off);
          Mma(acc[mt][0], af, bf[0], bf[1]);
          Mma(acc[mt][1], af, bf[2], bf[3]);
          if constexpr (kSplitA) {
            Ldmatrix4(af, sa + kBlockM * kBlockK + a_off);
            Mma(acc[mt][0], af, bf[0], bf[1]);
            Mma(acc[mt][1], af, bf[2], bf[3]);
          }
        }
      }
      const int next = kt + kStages - 1;
      if (next < kt_end) load_stage((i + kStages - 1) % kStages, next);
      CpAsyncCommit();
    }
    CpAsyncWait<0>();
    __syncthreads();

    // Epilogue: thread holds rows (lane/4, lane/4 + 8) x columns (2 (lane%4), +1) of each tile.
    const int n_warp = n0 + warp * 16;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + mt * 16 + lane / 4 + half * 8;
        if (row >= row_end) continue;
        if (p.epilogue == GemmEpilogue::kSiluMulBf16) {
          if (n_warp >= p.n) continue;
          const int col = (n_warp / 16) * 8 + (lane % 4) * 2;
          const float v0 = internal::SiluMulValue(acc[mt][0][half * 2], acc[mt][1][half * 2]);
          const float v1 = internal::SiluMulValue(acc[mt][0][half * 2 + 1], acc[mt][1][half * 2 + 1]);
          const __nv_bfloat162 hi = __floats2bfloat162_rn(v0, v1);
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * p.ldo + col) = hi;
          if (p.out_lo != nullptr) {
            const float2 h = __bfloat1622float2(hi);
            *reinterpret_cast<__nv_bfloat162*>(p.out_lo + row * p.ldo + col) = __floats2bfloat162_rn(v0 - h.x, v1 - h.y);
          }
          continue;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = n_warp + nt * 8 + (lane % 4) * 2;
          if (col >= p.n) continue;
          const float v0 = acc[mt][nt][half * 2], v1 = acc[mt][nt][half * 2 + 1];
          switch (p.epilogue) {
            case GemmEpilogue::kStoreF32:
              *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * p.ldo + col) = make_float2(v0, v1);
              break;
            case GemmEpilogue::kStoreBf16:
              *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * p.ldo + col) =
                  __floats2bfloat162_rn(v0, v1);
              break;
            case GemmEpilogue::kAccumulateF32: {
              float* dst = static_cast<float*>(p.out) + row * p.ldo + col;
              if (p.split_k > 1) {
                AtomicAdd2(dst, v0, v1);
              } else {
                float2 old = *reinterpret_cast<float2*>(dst);
                *reinterpret_cast<float2*>(dst) = make_float2(old.x + v0, old.y + v1);
              }
              break;
            }
            case GemmEpilogue::kScatterAddF32: {
              const int dst_row = p.out_rows != nullptr ? p.out_rows[row] : row;
              const float s = p.row_scale != nullptr ? p.row_scale[row] : 1.0f;
              AtomicAdd2(static_cast<float*>(p.out) + static_cast<int64_t>(dst_row) * p.ldo + col, s * v0, s * v1);
              break;
            }
            default:
              break;
          }
        }
      }
    }
  }
}

template <int kMTiles, bool kSplitA>
cudaError_t Launch(const GroupedGemmParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = SmemBytes<kMTiles, kSplitA>();
  static const cudaError_t attr = cudaFuncSetAttribute(GroupedGemmKernel<kMTiles, kSplitA>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  return internal::Launch(GroupedGemmKernel<kMTiles, kSplitA>, grid, dim3(kThreads), smem, stream, p);
}

template <bool kSplitA>
cudaError_t LaunchTiles(const GroupedGemmParams& p, dim3 grid, cudaStream_t stream) {
  if (p.rows_hint <= 16) return Launch<1, kSplitA>(p, grid, stream);
  if (p.rows_hint <= 32) return Launch<2, kSplitA>(p, grid, stream);
  return Launch<4, kSplitA>(p, grid, stream);
}

}  // namespace

cudaError_t GroupedGemm(const GroupedGemmParams& p, cudaStream_t stream) {
  const bool grouped = p.group_offsets != nullptr;
  if (!grouped && p.num_rows == 0) return cudaSuccess;
  const bool accumulating = p.epilogue == GemmEpilogue::kAccumulateF32 || p.epilogue == GemmEpilogue::kScatterAddF32;
  const int out_cols = p.epilogue == GemmEpilogue::kSiluMulBf16 ? p.n / 2 : p.n;
  const int grid_y = grouped ? (p.max_active > 0 ? p.max_active : p.num_groups) : 1;
  if (p.a == nullptr || p.b == nullptr || p.out == nullptr || p.n <= 0 || p.k <= 0 || p.n % 8 != 0 ||
      p.k % 8 != 0 || p.lda % 8 != 0 || p.lda < p.k || p.ldo < out_cols || p.ldo % 2 != 0 ||
      reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || reinterpret_cast<uintptr_t>(p.b) % 16 != 0 ||
      p.b_group_stride % 8 != 0 || (!grouped && p.num_rows < 0) || (grouped && p.num_groups <= 0) ||
      (p.active_groups != nullptr && p.num_active == nullptr) || grid_y <= 0 || grid_y > 65535 ||
      (p.tile_group != nullptr && (p.tile_row == nullptr || p.num_tiles == nullptr || !grouped)) ||
      p.split_k < 1 || p.split_k > 64 || (p.split_k > 1 && !accumulating) || p.m_chunks < 1 || p.m_chunks > 64 ||
      (p.split_k > 1 && p.m_chunks > 1) || (p.a_lo != nullptr && reinterpret_cast<uintptr_t>(p.a_lo) % 16 != 0) ||
      (p.out_lo != nullptr && p.epilogue != GemmEpilogue::kSiluMulBf16) ||
      (p.epilogue == GemmEpilogue::kSiluMulBf16 && p.n % 16 != 0)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((p.n + kBlockN - 1) / kBlockN, grid_y, std::max(p.split_k, p.m_chunks));
  return p.a_lo != nullptr ? LaunchTiles<true>(p, grid, stream) : LaunchTiles<false>(p, grid, stream);
}

}  // namespace tandem::cuda
