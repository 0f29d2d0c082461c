#include "kernels/cuda/mla_decode_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tandem::cuda {
namespace {

using namespace mma;  // NOLINT: the kernels below are written in these building blocks

// ---------------------------------------------------------------------------------------
// Shared pieces.

constexpr int kTile = 64;  // cache positions per KV tile (one 64-token block)
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxSplits = 128;

// What a thread block needs to know; passed by value.
struct DecodeArgs {
  const __nv_bfloat16* q;
  const __nv_bfloat16* q_lo;  // split queries (MlaDecodeParams::q_lo): portable kernel only
  int64_t q_stride;
  const __nv_bfloat16* kv;
  const int32_t* block_tables;
  const int32_t* cache_lens;
  int q_per_seq, heads, R, D, block_size, max_blocks;
  int kv_offset;  // position p reads cache slot p + kv_offset (MlaDecodeParams::kv_offset)
  int rows;       // query rows per sequence: q_per_seq * heads (row = token * heads + head)
  int row_tiles;  // thread blocks per sequence and split, each a tile of rows
  int splits;
  int total_rows;  // num_seqs * rows
  float scale_log2;
  float* out;
  int64_t out_stride;
  float* ws_o;    // [splits][total_rows][R], each split's output normalized by its own sum
  float* ws_lse;  // [splits][total_rows], log2-domain log-sum-exp (-inf: nothing visible)
  bool prefetch_kv;  // the wgmma kernel pulls its cache rows into L2 before the wait (small launches)
};

// The range of 64-position tiles that split `split` of a sequence of `len` positions covers.
__device__ __forceinline__ void SplitRange(int len, int splits, int split, int* t0, int* t1) {
  const int tiles = (len + kTile - 1) / kTile;
  const int per = (tiles + splits - 1) / splits;
  *t0 = split * per;
  *t1 = min(tiles, *t0 + per);
}

// Last position query row `row` of a sequence of `len` positions may see (padding rows of
// a tile see everything, so no row is ever empty of keys).
__device__ __forceinline__ int RowLimit(const DecodeArgs& a, int len, int row) {
  return row < a.rows ? len - a.q_per_seq + row / a.heads : len - 1;
}

// One sequence's cache rows, addressed through its block table. The kernels read these
// fields out of DecodeArgs once, into registers, before their loops: the loops' asm
// statements (cp.async, wgmma fences) clobber memory, and a field read through a reference
// to the parameter after one of them is a new load, with everything derived from it (the
// block-table divisions) computed again. Whether the compiler copies the parameter into
// registers or reads it in place is its choice (a 136-byte DecodeArgs, or
// __grid_constant__, tipped it to reading in place: batch-1 decode on the H200 went from
// 2.01 to 2.27 ms); with these copies the loops no longer depend on that choice.
struct SeqCache {
  const __nv_bfloat16* kv;
  const int32_t* table;  // the sequence's row of the block tables
  int block_size, D, kv_offset;

  __device__ __forceinline__ SeqCache(const DecodeArgs& a, int seq)
      : kv(a.kv), table(a.block_tables + static_cast<int64_t>(seq) * a.max_blocks), block_size(a.block_size), D(a.D),
        kv_offset(a.kv_offset) {}

  // The cache row of position `pos`.
  __device__ __forceinline__ const __nv_bfloat16* Row(int pos) const {
    const int slot = pos + kv_offset;
    const int32_t block = table[slot / block_size];
    return kv + (static_cast<int64_t>(block) * block_size + slot % block_size) * D;
  }
};

// Where a row's normalized output goes: `out` when the launch does not split, else the
// split's workspace slice. Computed once per row, outside the column loops.
__device__ __forceinline__ float* OutRow(const DecodeArgs& a, int seq, int split, int row) {
  if (a.splits == 1) {
    const int token = seq * a.q_per_seq + row / a.heads;
    return a.out + token * a.out_stride + static_cast<int64_t>(row % a.heads) * a.R;
  }
  const int64_t grow = static_cast<int64_t>(split) * a.total_rows + static_cast<int64_t>(seq) * a.rows + row;
  return a.ws_o + grow * a.R;
}
__device__ __forceinline__ void Store2(float* row_out, int col, float v0, float v1) {
  *reinterpret_cast<float2*>(row_out + col) = make_float2(v0, v1);
}
__device__ __forceinline__ void StoreLse(const DecodeArgs& a, int seq, int split, int row, float lse) {
  if (a.splits > 1) a.ws_lse[static_cast<int64_t>(split) * a.total_rows + static_cast<int64_t>(seq) * a.rows + row] = lse;
}

// ---------------------------------------------------------------------------------------
// Portable kernel: mma.sync m16n8k16. A thread block takes TM = 16*MT query rows of one
// sequence and one split; 4*MT warps. Per 64-position tile: each warp scores its 16 rows
// against 16 positions (QK^T over all D columns), the row maxima are exchanged through
// shared memory, the probabilities go to shared memory in bf16, then each warp
// accumulates all TM rows x its NT*8 value columns (P·V over the first R columns of the
// same tile). Shared memory rows are padded by 16 bytes (conflict-free ldmatrix).

template <int MT, int NT>
__global__ void __launch_bounds__(MT * 128, 1) MlaDecodeMmaKernel(DecodeArgs a) {
  internal::WaitAndTrigger();
  constexpr int kWarps = MT * 4;
  constexpr int kThreads = kWarps * 32;
  constexpr int TM = MT * 16;
  constexpr int kPStride = kTile + 8;
  extern __shared__ __align__(16) uint8_t smem[];
  const int D = a.D;
  const int SD = D + 8;  // padded row, elements
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);  // [TM][SD]
  __nv_bfloat16* sKV = sQ + TM * SD;                           // [2][64][SD]
  __nv_bfloat16* sP = sKV + 2 * kTile * SD;                    // [TM][kPStride]
  float* sRed = reinterpret_cast<float*>(sP + TM * kPStride);  // [4][TM]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  int cta = blockIdx.x;
  const int rt = cta % a.row_tiles;
  cta /= a.row_tiles;
  const int split = cta % a.splits;
  const int seq = cta / a.splits;
  const int len = a.cache_lens[seq];
  int t0, t1;
  SplitRange(len, a.splits, split, &t0, &t1);
  // Split queries: query row L's value in tile row 16 (L / 8) + L % 8, its remainder 8 rows
  // below (the thread holding a score of one holds the other's too); a tile then holds
  // TM / 2 query rows.
  const bool split_q = a.q_lo != nullptr;
  const int tile_queries = split_q ? TM / 2 : TM;
  const int row0 = rt * tile_queries;
  if (t0 >= t1) {  // nothing of this sequence falls in this split
    if (tid < tile_queries && row0 + tid < a.rows) StoreLse(a, seq, split, row0 + tid, -INFINITY);
    return;
  }

  const int cpr = D / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < TM * cpr; idx += kThreads) {
    const int r = idx / cpr, c = idx - r * cpr;
    const bool lo = split_q && (r % 16) >= 8;
    const int row = row0 + (split_q ? (r / 16) * 8 + r % 8 : r);
    const bool valid = row < a.rows;
    const __nv_bfloat16* src =
        valid ? (lo ? a.q_lo : a.q) + static_cast<int64_t>(seq * a.q_per_seq + row / a.heads) * a.q_stride +
                    static_cast<int64_t>(row % a.heads) * D + c * 8
              : a.q;
    CpAsync16(SmemAddr(sQ + r * SD + c * 8), src, valid);
  }
  // KV tile loads: 8 threads per row, each 16 bytes of every 128-byte segment (coalesced),
  // kThreads / 8 rows per pass.
  const SeqCache cache(a, seq);
  auto load_tile = [&](int tile, int buf) {
    const uint32_t dst = SmemAddr(sKV + buf * kTile * SD);
    for (int r = tid / 8; r < kTile; r += kThreads / 8) {
      const int pos = tile * kTile + r;
      const bool valid = pos < len;
      const __nv_bfloat16* src = valid ? cache.Row(pos) : cache.kv;
      for (int c = tid % 8; c < cpr; c += 8) CpAsync16(dst + (r * SD + c * 8) * 2, src + c * 8, valid);
    }
  };
  load_tile(t0, 0);
  CpAsyncCommit();
  if (t0 + 1 < t1) load_tile(t0 + 1, 1);
  CpAsyncCommit();

  // Score phase: warp (wm, wn) = rows 16*wm.., positions 16*wn.. of the tile.
  const int wm = warp / 4, wn = warp % 4;
  const int q0 = split_q ? 8 * wm + g : 16 * wm + g;  // the query row of score row 16 wm + g
  const int lim0 = RowLimit(a, len, row0 + q0);
  const int lim1 = split_q ? lim0 : RowLimit(a, len, row0 + 16 * wm + g + 8);
  float m_s[2] = {-INFINITY, -INFINITY}, l_s[2] = {0.0f, 0.0f};  // this warp's score rows
  float m_v[MT][2];                                              // all rows, for the value phase
  float o[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m_v[mt][0] = m_v[mt][1] = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  }
  const uint32_t a_base = SmemAddr(sQ + (16 * wm + lane % 16) * SD + 8 * (lane / 16));
  const int first_masked = len - a.q_per_seq + 1;  // positions from here on are masked for some row
  const float scale_log2 = a.scale_log2;
  const int R = a.R;

  for (int it = t0; it < t1; ++it) {
    const int buf = (it - t0) & 1;
    CpAsyncWait<1>();
    __syncthreads();
    const __nv_bfloat16* kv = sKV + buf * kTile * SD;

    float s[2][4] = {};
    {
      // Two accumulator sets (even / odd column steps): half the dependent-mma chain.
      float s2[2][4] = {};
      const uint32_t b_base = SmemAddr(kv + (16 * wn + lane % 8 + 8 * (lane / 16)) * SD + 8 * ((lane / 8) % 2));
      int ks = 0;
#pragma unroll 2
      for (; ks + 1 < D / 16; ks += 2) {
        uint32_t af[4], bf[4], af2[4], bf2[4];
        Ldmatrix4(a_base + ks * 32, af);
        Ldmatrix4(b_base + ks * 32, bf);
        Ldmatrix4(a_base + ks * 32 + 32, af2);
        Ldmatrix4(b_base + ks * 32 + 32, bf2);
        Mma16816(s[0], af, bf[0], bf[1]);
        Mma16816(s[1], af, bf[2], bf[3]);
        Mma16816(s2[0], af2, bf2[0], bf2[1]);
        Mma16816(s2[1], af2, bf2[2], bf2[3]);
      }
      if (ks < D / 16) {
        uint32_t af[4], bf[4];
        Ldmatrix4(a_base + ks * 32, af);
        Ldmatrix4(b_base + ks * 32, bf);
        Mma16816(s[0], af, bf[0], bf[1]);
        Mma16816(s[1], af, bf[2], bf[3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] += s2[j][e];
        if (split_q) {  // value + remainder rows: the whole score in both
          s[j][0] += s[j][2];
          s[j][1] += s[j][3];
          s[j][2] = s[j][0];
          s[j][3] = s[j][1];
        }
      }
    }
    // s[j][e]: row 16*wm + g (+8 for e >= 2), position it*64 + 16*wn + 8*j + 2*t + (e & 1).
    const bool masked = (it + 1) * kTile > first_masked;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[j][e] * scale_log2;
        if (masked) {
          const int pos = it * kTile + 16 * wn + 8 * j + 2 * t + (e & 1);
          if (pos > (e < 2 ? lim0 : lim1)) v = -INFINITY;
        }
        s[j][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = QuadMax(mx0);
    mx1 = QuadMax(mx1);
    if (t == 0) {
      sRed[wn * TM + 16 * wm + g] = mx0;
      sRed[wn * TM + 16 * wm + g + 8] = mx1;
    }
    __syncthreads();
    {  // probabilities of this warp's scores
      float ms[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * wm + g + 8 * hh;
        const float tmax = fmaxf(fmaxf(sRed[r], sRed[TM + r]), fmaxf(sRed[2 * TM + r], sRed[3 * TM + r]));
        const float mnew = fmaxf(m_s[hh], tmax);
        ms[hh] = mnew == -INFINITY ? 0.0f : mnew;
        l_s[hh] *= Exp2(m_s[hh] - ms[hh]);
        m_s[hh] = mnew;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float p0 = Exp2(s[j][0] - ms[0]), p1 = Exp2(s[j][1] - ms[0]);
        const float p2 = Exp2(s[j][2] - ms[1]), p3 = Exp2(s[j][3] - ms[1]);
        l_s[0] += p0 + p1;
        l_s[1] += p2 + p3;
        const int col = 16 * wn + 8 * j + 2 * t;
        const uint32_t hi = PackBf16(p0, p1);
        *reinterpret_cast<uint32_t*>(sP + (16 * wm + g) * kPStride + col) = hi;
        // Split queries: the second row takes the probabilities' bf16 remainders.
        *reinterpret_cast<uint32_t*>(sP + (16 * wm + g + 8) * kPStride + col) =
            split_q ? PackBf16(p0 - __uint_as_float(hi << 16), p1 - __uint_as_float(hi & 0xffff0000u))
                    : PackBf16(p2, p3);
      }
    }
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * mt + g + 8 * hh;
        const float tmax = fmaxf(fmaxf(sRed[r], sRed[TM + r]), fmaxf(sRed[2 * TM + r], sRed[3 * TM + r]));
        const float mnew = fmaxf(m_v[mt][hh], tmax);
        alpha[mt][hh] = Exp2(m_v[mt][hh] - (mnew == -INFINITY ? 0.0f : mnew));
        m_v[mt][hh] = mnew;
      }
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        o[mt][n][0] *= alpha[mt][0];
        o[mt][n][1] *= alpha[mt][0];
        o[mt][n][2] *= alpha[mt][1];
        o[mt][n][3] *= alpha[mt][1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Ldmatrix4(SmemAddr(sP + (16 * mt + lane % 16) * kPStride + 16 * kk + 8 * (lane / 16)), pa[mt]);
      }
      const uint32_t v_base = SmemAddr(kv + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * SD + 8 * (lane / 16));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        const int n0 = (warp * NT + 2 * np) * 8;
        if (n0 < R) {
          uint32_t vb[4];
          Ldmatrix4Trans(v_base + n0 * 2, vb);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma16816(o[mt][2 * np], pa[mt], vb[0], vb[1]);
            Mma16816(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();
    if (it + 2 < t1) load_tile(it + 2, buf);
    CpAsyncCommit();
  }

  // Row sums: each score warp holds its 16 positions' part.
  l_s[0] = QuadSum(l_s[0]);
  l_s[1] = QuadSum(l_s[1]);
  if (t == 0) {
    sRed[wn * TM + 16 * wm + g] = l_s[0];
    sRed[wn * TM + 16 * wm + g + 8] = l_s[1];
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (split_q && hh == 1) continue;  // the remainder row: summed into the value row's output
      const int r = 16 * mt + g + 8 * hh;
      const int row = row0 + (split_q ? 8 * mt + g : r);
      if (row >= a.rows) continue;
      const float l = sRed[r] + sRed[TM + r] + sRed[2 * TM + r] + sRed[3 * TM + r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* row_out = OutRow(a, seq, split, row);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int col = (warp * NT + n) * 8 + 2 * t;
        const float v0 = split_q ? o[mt][n][0] + o[mt][n][2] : o[mt][n][2 * hh];
        const float v1 = split_q ? o[mt][n][1] + o[mt][n][3] : o[mt][n][2 * hh + 1];
        if (col < R) Store2(row_out, col, v0 * inv, v1 * inv);
      }
      if (warp == 0 && t == 0) StoreLse(a, seq, split, row, l > 0.0f ? m_v[mt][hh] + log2f(l) : -INFINITY);
    }
  }
}

// ---------------------------------------------------------------------------------------
// sm_90a kernel: wgmma, for kv_lora_rank 512 + rope 64. A thread block of two warpgroups
// takes 64 query rows of one sequence and one split (zero queries pad a sequence with
// fewer rows: with 16 heads the kernel is memory-bound anyway). Q (64 x 576) and two KV tiles
// (64 x 576 each) sit in shared memory in the 128-byte-swizzled layout wgmma reads: nine
// 8 KB atoms of [64 rows][64 columns], 16-byte chunk c of row r at (c ^ (r % 8)) * 16.
// Per tile: warpgroup 0 computes S = Q K^T (64 x 64, 36 wgmma m64n64k16), the online
// softmax, and writes P (bf16, same swizzled layout) and the rescale factors; then both
// warpgroups accumulate O[:, 256*wg .. +256] += P V with m64n256k16 (V = the tile's first
// 512 columns read MN-major: the same shared memory serves as K and as V).

constexpr int kWgD = 576;
constexpr int kWgR = 512;
constexpr int kAtomBytes = 64 * 128;            // 64 rows x 64 bf16
constexpr int kWgTileBytes = 9 * kAtomBytes;    // 64 x 576 bf16
constexpr int kWgSmemBytes = 3 * kWgTileBytes   // Q, KV x 2
                             + kAtomBytes       // P
                             + 3 * 64 * 4       // alpha, row sums, row maxima
                             + 1024;            // alignment slack


#ifdef TANDEM_HAS_WGMMA
using namespace wgmma;  // NOLINT: the kernel below is written in these building blocks

__device__ __forceinline__ void WgmmaM64N256K16TransB(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return wgmma::SwizzledOffset(row, chunk, kAtomBytes);
}
#endif  // TANDEM_HAS_WGMMA


// This block's cache rows into L2 while the previous kernel (MlaPrepare) runs. Safe before
// the wait: the block tables and lengths are uploaded before a step's first kernel, the
// earlier positions were written by earlier steps, and the newest entry, which MlaPrepare
// writes, lands in L2 anyway (a prefetch is only a hint).
__device__ __forceinline__ void PrefetchSplitKv(const DecodeArgs& a) {
  if (!a.prefetch_kv) return;
  int cta = blockIdx.x;
  if (cta % a.row_tiles != 0) return;  // the first row tile's block prefetches for all
  cta /= a.row_tiles;
  const int split = cta % a.splits, seq = cta / a.splits;
  const int len = a.cache_lens[seq];
  int t0, t1;
  SplitRange(len, a.splits, split, &t0, &t1);
  const int p0 = t0 * kTile, p1 = min(len, t1 * kTile);
  const SeqCache cache(a, seq);
  const int lines = (cache.D * 2 + 127) / 128;  // 576 bf16: 9 lines
  for (int i = threadIdx.x; i < (p1 - p0) * lines; i += blockDim.x) {
    const int pos = p0 + i / lines;
    internal::PrefetchL2(reinterpret_cast<const char*>(cache.Row(pos)) + (i % lines) * 128);
  }
}

__global__ void __launch_bounds__(256, 1) MlaDecodeWgmmaKernel(DecodeArgs a) {
  PrefetchSplitKv(a);
  internal::WaitAndTrigger();
#ifdef TANDEM_HAS_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  uint8_t* base = smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
  uint8_t* sQ = base;
  uint8_t* sKV = base + kWgTileBytes;  // [2][kWgTileBytes]
  uint8_t* sP = base + 3 * kWgTileBytes;
  float* sAlpha = reinterpret_cast<float*>(sP + kAtomBytes);
  float* sSum = sAlpha + 64;
  float* sMax = sSum + 64;
  const uint32_t q_addr = SmemAddr(sQ), kv_addr0 = SmemAddr(sKV), p_addr = SmemAddr(sP);

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int ww = (tid % 128) / 32;
  int cta = blockIdx.x;
  const int rt = cta % a.row_tiles;
  cta /= a.row_tiles;
  const int split = cta % a.splits;
  const int seq = cta / a.splits;
  const int len = a.cache_lens[seq];
  int t0, t1;
  SplitRange(len, a.splits, split, &t0, &t1);
  const int row0 = rt * 64;
  if (t0 >= t1) {
    if (tid < 64 && row0 + tid < a.rows) StoreLse(a, seq, split, row0 + tid, -INFINITY);
    return;
  }

  // Loads: 8 threads per row, each 16 bytes of every 128-byte segment (coalesced), 32
  // rows per pass; 72 chunks of 16 bytes a row.
  const int lr = tid / 8, lc = tid % 8;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int r = lr + 32 * pass, row = row0 + r;
    const bool valid = row < a.rows;
    const __nv_bfloat16* src =
        valid ? a.q + static_cast<int64_t>(seq * a.q_per_seq + row / a.heads) * a.q_stride +
                    static_cast<int64_t>(row % a.heads) * kWgD
              : a.q;
#pragma unroll
    for (int c = lc; c < kWgD / 8; c += 8) CpAsync16(q_addr + SwizzledOffset(r, c), src + c * 8, valid);
  }
  const SeqCache cache(a, seq);
  auto load_tile = [&](int tile, int buf) {
    const uint32_t dst = kv_addr0 + buf * kWgTileBytes;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int r = lr + 32 * pass, pos = tile * kTile + r;
      const bool valid = pos < len;
      const __nv_bfloat16* src = valid ? cache.Row(pos) : cache.kv;
#pragma unroll
      for (int c = lc; c < kWgD / 8; c += 8) CpAsync16(dst + SwizzledOffset(r, c), src + c * 8, valid);
    }
  };
  load_tile(t0, 0);
  CpAsyncCommit();
  if (t0 + 1 < t1) load_tile(t0 + 1, 1);
  CpAsyncCommit();

  // Accumulator layout (both warpgroups alike): value 4*j + e is row 16*ww + g (+8 for
  // e >= 2), column 8*j + 2*t + (e & 1) of the warpgroup's 64 x N tile.
  const int r0 = 16 * ww + g, r1 = r0 + 8;
  const int lim0 = RowLimit(a, len, row0 + r0), lim1 = RowLimit(a, len, row0 + r1);
  const int first_masked = len - a.q_per_seq + 1;
  const float scale_log2 = a.scale_log2;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // warpgroup 0's softmax state

  for (int it = t0; it < t1; ++it) {
    const int buf = (it - t0) & 1;
    const uint32_t kv_addr = kv_addr0 + buf * kWgTileBytes;
    CpAsyncWait<1>();
    FenceProxyAsync();
    __syncthreads();
    if (wg == 0) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kWgD / 16; ++k) {
        const uint32_t off = (k >> 2) * kAtomBytes + (k & 3) * 32;
        WgmmaM64N64K16(s, SmemDesc(q_addr + off, 16, 1024), SmemDesc(kv_addr + off, 16, 1024), k > 0 ? 1 : 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) FenceReg(s[i]);

      const bool masked = (it + 1) * kTile > first_masked;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[4 * j + e] * scale_log2;
          if (masked) {
            const int pos = it * kTile + 8 * j + 2 * t + (e & 1);
            if (pos > (e < 2 ? lim0 : lim1)) v = -INFINITY;
          }
          s[4 * j + e] = v;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      mx0 = QuadMax(mx0);
      mx1 = QuadMax(mx1);
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float ms0 = mn0 == -INFINITY ? 0.0f : mn0, ms1 = mn1 == -INFINITY ? 0.0f : mn1;
      const float alpha0 = Exp2(m0 - ms0), alpha1 = Exp2(m1 - ms1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = Exp2(s[4 * j] - ms0), p1 = Exp2(s[4 * j + 1] - ms0);
        const float p2 = Exp2(s[4 * j + 2] - ms1), p3 = Exp2(s[4 * j + 3] - ms1);
        sum0 += p0 + p1;
        sum1 += p2 + p3;
        // P row r, positions 8j + 2t, +1: chunk j of the swizzled row (r0 % 8 == r1 % 8).
        const uint32_t off = ((j ^ (r0 & 7)) << 4) + t * 4;
        *reinterpret_cast<uint32_t*>(sP + r0 * 128 + off) = PackBf16(p0, p1);
        *reinterpret_cast<uint32_t*>(sP + r1 * 128 + off) = PackBf16(p2, p3);
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
      if (t == 0) {
        sAlpha[r0] = alpha0;
        sAlpha[r1] = alpha1;
      }
      FenceProxyAsync();
    }
    __syncthreads();
    const float alpha0 = sAlpha[r0], alpha1 = sAlpha[r1];
    if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {  // some row's maximum moved
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= alpha0;
        o[4 * j + 1] *= alpha0;
        o[4 * j + 2] *= alpha1;
        o[4 * j + 3] *= alpha1;
      }
    }
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      WgmmaM64N256K16TransB(o, SmemDesc(p_addr + kk * 32, 16, 1024),
                            SmemDesc(kv_addr + wg * 4 * kAtomBytes + kk * 16 * 128, kAtomBytes, 1024), 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) FenceReg(o[i]);
    __syncthreads();
    if (it + 2 < t1) load_tile(it + 2, buf);
    CpAsyncCommit();
  }

  if (wg == 0) {
    l0 = QuadSum(l0);
    l1 = QuadSum(l1);
    if (t == 0) {
      sSum[r0] = l0;
      sSum[r1] = l1;
      sMax[r0] = m0;
      sMax[r1] = m1;
    }
  }
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = hh == 0 ? r0 : r1;
    const int row = row0 + r;
    if (row >= a.rows) continue;
    const float l = sSum[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* row_out = OutRow(a, seq, split, row);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      Store2(row_out, wg * 256 + 8 * j + 2 * t, o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
    }
    if (wg == 0 && t == 0) StoreLse(a, seq, split, row, l > 0.0f ? sMax[r] + log2f(l) : -INFINITY);
  }
#else
  __trap();  // built only for sm_90a; the launcher never selects it elsewhere
#endif
}

// ---------------------------------------------------------------------------------------
// Split-KV combine: one block per (token, head) row; out = sum_s w_s * o_s with
// w_s = 2^(lse_s - max) / sum_s' 2^(lse_s' - max). Splits that saw nothing (lse = -inf)
// get weight 0 and their (unwritten) partial outputs are never read. Each thread owns 4
// columns, so all of a row's loads are independent.

constexpr int kCombineThreads = 128;  // x 4 columns >= kv_lora_rank (512)

// The split weights of row `row`, lane l holding those of splits l, l + 32, ... (called by
// a whole warp; splits beyond a.splits get 0).
__device__ __forceinline__ void SplitWeightsInLanes(const DecodeArgs& a, int row, float (&weight)[kMaxSplits / 32]) {
  const int lane = threadIdx.x % 32;
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    weight[k] = s < a.splits ? a.ws_lse[static_cast<int64_t>(s) * a.total_rows + row] : -INFINITY;
    mx = fmaxf(mx, weight[k]);
  }
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    weight[k] = weight[k] == -INFINITY ? 0.0f : Exp2(weight[k] - mx);
    sum += weight[k];
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) weight[k] *= inv;
}

// The weight of split s (the same for the whole warp) from SplitWeightsInLanes' registers.
__device__ __forceinline__ float SplitWeightOf(const float (&weight)[kMaxSplits / 32], int s) {
  float w = weight[0];
#pragma unroll
  for (int k = 1; k < kMaxSplits / 32; ++k) w = s / 32 == k ? weight[k] : w;
  return __shfl_sync(0xffffffffu, w, s % 32);
}

// The split weights of row `row` into weight[0, splits) (called by one warp).
__device__ __forceinline__ void SplitWeights(const DecodeArgs& a, int row, float* weight) {
  const int lane = threadIdx.x % 32;
  float w[kMaxSplits / 32];
  SplitWeightsInLanes(a, row, w);
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    if (lane + 32 * k < a.splits) weight[lane + 32 * k] = w[k];
  }
}

__global__ void __launch_bounds__(kCombineThreads) MlaDecodeCombineKernel(DecodeArgs a) {
  internal::WaitAndTrigger();
  __shared__ float weight[kMaxSplits];
  const int row = blockIdx.x;  // token * heads + head
  const int tid = threadIdx.x;
  if (tid < 32) SplitWeights(a, row, weight);
  __syncthreads();
  const int c = tid * 4;
  if (c >= a.R) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = 0; s < a.splits; ++s) {
    const float w = weight[s];
    if (w == 0.0f) continue;
    const float4 x =
        *reinterpret_cast<const float4*>(a.ws_o + (static_cast<int64_t>(s) * a.total_rows + row) * a.R + c);
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
  }
  const int token = row / a.heads, head = row % a.heads;
  float* dst = a.out + token * a.out_stride + static_cast<int64_t>(head) * a.R + c;
  *reinterpret_cast<float2*>(dst) = make_float2(acc.x, acc.y);
  *reinterpret_cast<float2*>(dst + 2) = make_float2(acc.z, acc.w);
}

// ---------------------------------------------------------------------------------------
// Split combine fused with the value projection (MlaDecodeParams::w_uv): grid (v_dim / 32
// rounded up, heads); a block combines the latent output of its head for each query token
// in shared memory (or reads it from `out` without splits; its 8 warps each take every 8th
// split), then each warp projects it onto 4 value rows whose W_UV values it loaded into
// registers before waiting for the attention kernel.

struct OutputArgs {
  const __nv_bfloat16* w_uv;
  int64_t w_uv_head_stride;
  int v_dim;
  float* out_v;
  int64_t out_v_stride;
  int num_tokens;
};

constexpr int kOutThreads = 256;
constexpr int kOutWarps = kOutThreads / 32;
constexpr int kOutChunks = kWgR / 128;  // float4 chunks of a latent row per lane
constexpr int kOutRowsPerWarp = 4;
constexpr int kOutSplitsPerPass = 4;  // partial rows a warp loads at once
constexpr int kOutRows = kOutThreads / 32 * kOutRowsPerWarp;  // value rows per block
constexpr int kOutPairs = kWgR / 64;  // column pairs per lane: kv_lora_rank <= 512

__global__ void __launch_bounds__(kOutThreads) MlaDecodeOutputKernel(DecodeArgs a, OutputArgs o) {
  __shared__ __align__(16) float lat[kWgR];
  __shared__ __align__(16) float part[kOutWarps][kWgR];
  __shared__ float weight[kMaxSplits];
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = static_cast<int>(blockIdx.x) * kOutRows + warp * kOutRowsPerWarp;
  const int pairs = a.R / 2;
  // W_UV in registers before the wait (all loads in flight at once; out-of-range pairs and
  // rows read a valid address and are skipped by the dot product and the store).
  uint32_t w[kOutRowsPerWarp][kOutPairs];
#pragma unroll
  for (int r = 0; r < kOutRowsPerWarp; ++r) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(
        o.w_uv + h * o.w_uv_head_stride + static_cast<int64_t>(min(j0 + r, o.v_dim - 1)) * a.R);
#pragma unroll
    for (int i = 0; i < kOutPairs; ++i) w[r][i] = internal::LoadWeight(src + min(lane + 32 * i, pairs - 1));
  }
  internal::WaitAndTrigger();
  for (int token = 0; token < o.num_tokens; ++token) {
    const int row = token * a.heads + h;  // = seq * rows + (token % q_per_seq) * heads + h
    if (a.splits == 1) {
      const float* src = a.out + token * a.out_stride + static_cast<int64_t>(h) * a.R;
      for (int c = threadIdx.x; c < a.R; c += kOutThreads) lat[c] = src[c];
    } else {
      // Warp w sums splits w, w + 8, ... (kOutSplitsPerPass at a time, all their float4
      // loads in flight at once), then the 8 partial rows are added in shared memory. Each
      // warp computes the split weights itself, its log-sum-exp loads issued right after its
      // first partial rows: neither waits for the other. A split that saw nothing has weight
      // 0 and an unwritten partial, which the select below never adds.
      float4 acc4[kOutChunks];
#pragma unroll
      for (int q = 0; q < kOutChunks; ++q) acc4[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int chunks = a.R / 4;
      float lane_weight[kMaxSplits / 32];
      for (int s0 = warp; s0 < a.splits; s0 += kOutSplitsPerPass * kOutWarps) {
        float4 x[kOutSplitsPerPass][kOutChunks];
#pragma unroll
        for (int u = 0; u < kOutSplitsPerPass; ++u) {
          const int s = s0 + u * kOutWarps;
          const float4* src = reinterpret_cast<const float4*>(
              a.ws_o + (static_cast<int64_t>(min(s, a.splits - 1)) * a.total_rows + row) * a.R);
#pragma unroll
          for (int q = 0; q < kOutChunks; ++q) {
            const int ch = lane + 32 * q;
            x[u][q] = s < a.splits && ch < chunks ? __ldcg(src + ch) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
        if (s0 == warp) SplitWeightsInLanes(a, row, lane_weight);
#pragma unroll
        for (int u = 0; u < kOutSplitsPerPass; ++u) {
          const int s = s0 + u * kOutWarps;
          const float ws = s < a.splits ? SplitWeightOf(lane_weight, s) : 0.0f;
          if (ws == 0.0f) continue;
#pragma unroll
          for (int q = 0; q < kOutChunks; ++q) {
            acc4[q].x = fmaf(ws, x[u][q].x, acc4[q].x);
            acc4[q].y = fmaf(ws, x[u][q].y, acc4[q].y);
            acc4[q].z = fmaf(ws, x[u][q].z, acc4[q].z);
            acc4[q].w = fmaf(ws, x[u][q].w, acc4[q].w);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kOutChunks; ++q) {
        const int ch = lane + 32 * q;
        if (ch < chunks) reinterpret_cast<float4*>(part[warp])[ch] = acc4[q];
      }
      __syncthreads();
      for (int c = threadIdx.x; c < a.R; c += kOutThreads) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kOutWarps; ++w) v += part[w][c];
        lat[c] = v;
      }
    }
    __syncthreads();
    float acc[kOutRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kOutRowsPerWarp; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kOutPairs; ++i) {
      const int pc = lane + 32 * i;
      if (pc < pairs) {
        const float2 l = reinterpret_cast<const float2*>(lat)[pc];
#pragma unroll
        for (int r = 0; r < kOutRowsPerWarp; ++r) {
          __nv_bfloat162 b;
          memcpy(&b, &w[r][i], sizeof(b));
          const float2 wv = __bfloat1622float2(b);
          acc[r] = fmaf(l.x, wv.x, acc[r]);
          acc[r] = fmaf(l.y, wv.y, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kOutRowsPerWarp; ++r) {
      const float s = internal::WarpSum(acc[r]);
      if (lane == r && j0 + r < o.v_dim) {
        o.out_v[token * o.out_v_stride + static_cast<int64_t>(h) * o.v_dim + j0 + r] = s;
      }
    }
    __syncthreads();  // lat and weight are reused
  }
}

// ---------------------------------------------------------------------------------------
// Host side: plan (kernel, rows per block, splits) and launch.

enum class Impl { kMma = 1, kWgmma = 2 };

struct Plan {
  Impl impl = Impl::kMma;
  int mt = 1;  // mma kernel: 16-row tiles per block
  int nt = 2;  // mma kernel: value n8-tiles per warp
  int tile_rows = 16;
  int threads = 128;
  size_t smem = 0;
  const void* kernel = nullptr;
  int row_tiles = 1;
  int slots = 1;      // thread blocks resident at once on the device
  int width = 0;      // D / 16
  size_t smem_max = 0;  // the kernel's shared memory at the widest D (576)
};

using KernelFn = void (*)(DecodeArgs);

KernelFn MmaKernel(int mt, int nt) {
  if (mt == 1) {
    if (nt == 2) return MlaDecodeMmaKernel<1, 2>;
    if (nt == 4) return MlaDecodeMmaKernel<1, 4>;
    return MlaDecodeMmaKernel<1, 16>;
  }
  if (nt == 2) return MlaDecodeMmaKernel<2, 2>;
  return MlaDecodeMmaKernel<2, 8>;
}

bool DimsSupported(int kv_lora_rank, int rope_dim) {
  return kv_lora_rank >= 32 && kv_lora_rank <= 512 && kv_lora_rank % 32 == 0 && rope_dim >= 0 && rope_dim <= 64 &&
         rope_dim % 16 == 0;
}

int CurrentDeviceAttr(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    cudaGetLastError();  // clear
    return fallback;
  }
  return v;
}

// Raises the kernel's dynamic shared memory limit and returns how many of its blocks fit
// on a multiprocessor, once per (device, kernel, width): host work stays off the launch
// path (decode launches come every step, per layer).
int BlocksPerSm(const Plan& p) {
  constexpr int kDevices = 16, kKernels = 6, kWidths = 37;  // width = D / 16
  static std::atomic<int> cache[kDevices][kKernels][kWidths];  // 0: not computed yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  const int kernel = p.impl == Impl::kWgmma ? 0 : p.mt == 1 ? (p.nt == 2 ? 1 : p.nt == 4 ? 2 : 3) : (p.nt == 2 ? 4 : 5);
  std::atomic<int>* slot = dev >= 0 && dev < kDevices && p.width < kWidths ? &cache[dev][kernel][p.width] : nullptr;
  if (slot != nullptr) {
    const int cached = slot->load(std::memory_order_acquire);
    if (cached > 0) return cached;
  }
  int per_sm = 1;
  // The limit for the widest D this kernel serves, so that no width lowers it for another.
  if (cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.smem_max)) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p.kernel, p.threads, p.smem) != cudaSuccess) {
    cudaGetLastError();
    return 1;  // not cached: the launch reports the error
  }
  per_sm = std::max(per_sm, 1);
  if (slot != nullptr) slot->store(per_sm, std::memory_order_release);
  return per_sm;
}

// Kernel choice for these dimensions. requested: 0 auto, else an Impl. Returns false when
// the request cannot be served here.
bool MakePlan(int q_per_seq, int heads, int R, int P, int requested, Plan* plan, bool fixed = false) {
  const int rows = q_per_seq * heads;
  const int D = R + P;
  const int major = CurrentDeviceAttr(cudaDevAttrComputeCapabilityMajor, 0);
  const int sms = CurrentDeviceMultiprocessors();
  const bool wgmma_ok = major == 9 && R == kWgR && P == kWgD - kWgR;
  Plan p;
  // The wgmma kernel also for fewer than 64 rows (padded): memory-bound there, and its
  // tensor-core throughput keeps each tile's compute well under the tile's load time,
  // which the portable kernel's does not.
  if (requested == static_cast<int>(Impl::kWgmma) || (requested == 0 && wgmma_ok)) {
    if (!wgmma_ok) return false;
    p.impl = Impl::kWgmma;
    p.tile_rows = 64;
    p.threads = 256;
    p.smem = p.smem_max = kWgSmemBytes;
    p.kernel = reinterpret_cast<const void*>(MlaDecodeWgmmaKernel);
  } else if (requested == 0 || requested == static_cast<int>(Impl::kMma)) {
    p.impl = Impl::kMma;
    p.mt = rows <= 16 && !fixed ? 1 : 2;
    const int warps = 4 * p.mt;
    p.nt = 2;
    while (warps * p.nt * 8 < R) p.nt *= 2;  // mt 1: 2, 4, (8 ->) 16; mt 2: 2, (4 ->) 8
    if (p.mt == 1 && p.nt == 8) p.nt = 16;
    if (p.mt == 2 && p.nt == 4) p.nt = 8;
    p.tile_rows = 16 * p.mt;
    p.threads = 128 * p.mt;
    auto smem_for = [&](int d) {
      const size_t sd = static_cast<size_t>(d + 8);
      return (p.tile_rows * sd + 2 * kTile * sd + p.tile_rows * (kTile + 8)) * sizeof(__nv_bfloat16) +
             4 * p.tile_rows * sizeof(float);
    };
    p.smem = smem_for(D);
    p.smem_max = smem_for(512 + 64);
    p.kernel = reinterpret_cast<const void*>(MmaKernel(p.mt, p.nt));
  } else {
    return false;
  }
  p.row_tiles = (rows + p.tile_rows - 1) / p.tile_rows;
  p.width = D / 16;
  p.slots = sms * BlocksPerSm(p);
  *plan = p;
  return true;
}

// Most splits worth considering: enough thread blocks for a few waves.
int SplitCap(const Plan& plan, int num_seqs, int tiles) {
  const int base = num_seqs * plan.row_tiles;
  const int cap = std::max(1, (4 * plan.slots + base - 1) / base);
  return std::max(1, std::min({tiles, kMaxSplits, cap}));
}

// Splits per sequence minimizing (waves of thread blocks) x (tiles per block + 1 for the
// prologue), assuming every sequence is max_cache_len long.
int ChooseSplits(const Plan& plan, int num_seqs, int max_cache_len) {
  const int tiles = std::max(1, (max_cache_len + kTile - 1) / kTile);
  const int base = num_seqs * plan.row_tiles;
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= SplitCap(plan, num_seqs, tiles); ++s) {
    const double waves = std::ceil(static_cast<double>(base) * s / plan.slots);
    const double cost = waves * (std::ceil(static_cast<double>(tiles) / s) + 1.0) + (s > 1 ? 0.25 : 0.0);
    if (cost < best_cost - 1e-9) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

size_t WorkspaceForSplits(int num_seqs, int q_per_seq, int heads, int R, int splits) {
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(num_seqs) * q_per_seq * heads;
  // Partial outputs, then the log-sum-exps; each part 256-byte aligned.
  const size_t o_bytes = (static_cast<size_t>(splits) * rows * R * sizeof(float) + 255) / 256 * 256;
  return o_bytes + (static_cast<size_t>(splits) * rows * sizeof(float) + 255) / 256 * 256;
}

}  // namespace

size_t MlaDecodeWorkspaceBytesForSplits(int num_seqs, int q_per_seq, int num_heads, int kv_lora_rank,
                                        int num_splits) {
  if (num_seqs <= 0 || q_per_seq <= 0 || num_heads <= 0 || kv_lora_rank <= 0) return 0;
  return WorkspaceForSplits(num_seqs, q_per_seq, num_heads, kv_lora_rank, num_splits);
}

size_t MlaDecodeWorkspaceBytes(int num_seqs, int q_per_seq, int num_heads, int kv_lora_rank, int max_cache_len) {
  if (num_seqs <= 0 || q_per_seq <= 0 || num_heads <= 0 || kv_lora_rank <= 0 || max_cache_len <= 0) return 0;
  // The rope width is not given: take the largest need over every kernel any allowed
  // rope width could select (SplitCap bounds what ChooseSplits picks, for any shorter
  // max_cache_len too).
  const int tiles = (max_cache_len + kTile - 1) / kTile;
  int splits = 1;
  for (int rope = 0; rope <= 64; rope += 16) {
    for (int impl : {static_cast<int>(Impl::kMma), static_cast<int>(Impl::kWgmma)}) {
      Plan plan;
      if (!DimsSupported(kv_lora_rank, rope) || !MakePlan(q_per_seq, num_heads, kv_lora_rank, rope, impl, &plan)) {
        continue;
      }
      splits = std::max(splits, SplitCap(plan, num_seqs, tiles));
    }
  }
  return WorkspaceForSplits(num_seqs, q_per_seq, num_heads, kv_lora_rank, splits);
}

bool MlaDecodeSplitsQueries(int kv_lora_rank, int rope_dim) {
  Plan plan;
  return DimsSupported(kv_lora_rank, rope_dim) && MakePlan(1, 1, kv_lora_rank, rope_dim, 0, &plan) &&
         plan.impl == Impl::kMma;
}

cudaError_t MlaDecodeAttention(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0) return cudaSuccess;
  const int D = p.kv_lora_rank + p.rope_dim;
  if (p.num_seqs < 0 || p.q_per_seq < 1 || p.num_heads < 1 || !DimsSupported(p.kv_lora_rank, p.rope_dim) ||
      p.q == nullptr || p.kv_cache == nullptr || p.block_tables == nullptr || p.cache_lens == nullptr ||
      p.out == nullptr || p.block_size < 1 || p.max_cache_len < p.q_per_seq || p.kv_offset < 0 ||
      static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size < int64_t{p.max_cache_len} + p.kv_offset ||
      p.q_stride < static_cast<int64_t>(p.num_heads) * D || p.q_stride % 8 != 0 ||
      p.out_stride < static_cast<int64_t>(p.num_heads) * p.kv_lora_rank || p.out_stride % 2 != 0 ||
      reinterpret_cast<uintptr_t>(p.q) % 16 != 0 || reinterpret_cast<uintptr_t>(p.kv_cache) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.out) % 8 != 0 || p.num_splits < 0 || p.impl < 0 || p.impl > 2 ||
      reinterpret_cast<uintptr_t>(p.q_lo) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t tokens = static_cast<int64_t>(p.num_seqs) * p.q_per_seq;
  if (p.w_uv != nullptr &&
      (p.out_v == nullptr || tokens > kMlaDecodeFusedMaxTokens || p.v_dim <= 0 || p.v_dim % 2 != 0 ||
       p.out_v_stride < static_cast<int64_t>(p.num_heads) * p.v_dim || p.w_uv_head_stride % 2 != 0 ||
       reinterpret_cast<uintptr_t>(p.w_uv) % 4 != 0 || p.num_heads > 65535)) {
    return cudaErrorInvalidValue;
  }
  Plan plan;
  if (!MakePlan(p.q_per_seq, p.num_heads, p.kv_lora_rank, p.rope_dim, p.impl, &plan, p.fixed_plan)) {
    return cudaErrorInvalidValue;
  }
  // Split queries: the portable kernel, half a tile's rows per tile (more row tiles).
  const bool split_q = p.q_lo != nullptr && plan.impl == Impl::kMma;
  if (split_q) {
    const int per_tile = plan.tile_rows / 2;
    plan.row_tiles = (p.q_per_seq * p.num_heads + per_tile - 1) / per_tile;
  }
  const int tiles = (p.max_cache_len + kTile - 1) / kTile;
  const int splits = p.num_splits > 0 ? std::min({p.num_splits, std::max(tiles, 1), kMaxSplits})
                                      : ChooseSplits(plan, p.num_seqs, p.max_cache_len);

  DecodeArgs a{};
  a.q = p.q;
  a.q_lo = split_q ? p.q_lo : nullptr;
  a.q_stride = p.q_stride;
  a.kv = p.kv_cache;
  a.block_tables = p.block_tables;
  a.cache_lens = p.cache_lens;
  a.q_per_seq = p.q_per_seq;
  a.heads = p.num_heads;
  a.R = p.kv_lora_rank;
  a.D = D;
  a.block_size = p.block_size;
  a.max_blocks = p.max_blocks_per_seq;
  a.kv_offset = p.kv_offset;
  a.rows = p.q_per_seq * p.num_heads;
  a.row_tiles = plan.row_tiles;
  a.splits = splits;
  a.total_rows = p.num_seqs * a.rows;
  a.scale_log2 = p.softmax_scale * kLog2e;
  // Only where the whole cache read is small (a few sequences): a large launch runs in
  // several waves, and a later wave's prefetch would sit on the critical path.
  a.prefetch_kv = static_cast<int64_t>(p.num_seqs) * p.max_cache_len * D * 2 <= (8 << 20);
  a.out = p.out;
  a.out_stride = p.out_stride;
  if (splits > 1) {
    const size_t need = WorkspaceForSplits(p.num_seqs, p.q_per_seq, p.num_heads, p.kv_lora_rank, splits);
    if (p.workspace == nullptr || p.workspace_bytes < need || reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) {
      return cudaErrorInvalidValue;
    }
    a.ws_o = static_cast<float*>(p.workspace);
    const size_t o_bytes =
        (static_cast<size_t>(splits) * a.total_rows * a.R * sizeof(float) + 255) / 256 * 256;
    a.ws_lse = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + o_bytes);
  }
  const int64_t blocks = static_cast<int64_t>(p.num_seqs) * splits * plan.row_tiles;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const KernelFn kernel = plan.impl == Impl::kWgmma ? MlaDecodeWgmmaKernel : MmaKernel(plan.mt, plan.nt);
  cudaError_t err = internal::Launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(plan.threads), plan.smem,
                                     stream, a);
  if (err != cudaSuccess) return err;
  if (p.w_uv != nullptr) {
    const OutputArgs o{p.w_uv, p.w_uv_head_stride, p.v_dim, p.out_v, p.out_v_stride, static_cast<int>(tokens)};
    return internal::Launch(MlaDecodeOutputKernel, dim3((p.v_dim + kOutRows - 1) / kOutRows, p.num_heads),
                            dim3(kOutThreads), 0, stream, a, o);
  }
  if (splits == 1) return cudaSuccess;
  return internal::Launch(MlaDecodeCombineKernel, dim3(static_cast<unsigned>(a.total_rows)), dim3(kCombineThreads), 0,
                          stream, a);
}

}  // namespace tandem::cuda
