#include "kernels/cuda/mla_prefill_attention.h"

#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace tandem::cuda {
namespace {

using namespace mma;  // NOLINT: the kernels below are written in these building blocks

constexpr int kRows = 64;  // queries per thread block (4 warps x 16)
constexpr int kKeys = 64;  // keys per tile
constexpr int kThreads = 128;
static_assert(kThreads == 8 * 16, "loads: 8 threads per row, 16 rows per pass");
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillArgs {
  MlaPrefillParams p;
  int offset;  // num_kv - num_q: position of query 0
  float scale_log2;
  int64_t k_head_stride, v_head_stride;  // resolved: never 0
};

// KS: 16-column steps of the query/key width (nope + rope, zero-padded); VN: 8-column
// tiles of the value width (zero-padded). Flash-attention 2 layout: each warp owns 16
// query rows and all 64 keys of a tile, so the softmax needs no exchange between warps
// and P stays in registers as the A operand of P·V.
template <int KS, int VN>
__global__ void __launch_bounds__(kThreads) MlaPrefillKernel(PrefillArgs args) {
  constexpr int DK = KS * 16, DV = VN * 8;
  constexpr int SK = DK + 8, SV = DV + 8;  // padded rows: conflict-free ldmatrix
  const MlaPrefillParams& p = args.p;
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);  // [64][SK]
  __nv_bfloat16* sK = sQ + kRows * SK;                         // [2][64][SK]
  __nv_bfloat16* sV = sK + 2 * kKeys * SK;                     // [2][64][SV]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // longest (latest) query tiles first
  const int h = blockIdx.y;
  const int qk_dim = p.nope_dim + p.rope_dim;
  const int last_key = min(p.num_kv - 1, args.offset + min(q0 + kRows, p.num_q) - 1);
  const int tiles = last_key / kKeys + 1;

  // Loads: 8 threads per row, each 16 bytes of every 128-byte segment (coalesced), 16
  // rows per pass.
  const int lr = tid / 8, lc = tid % 8;
#pragma unroll
  for (int pass = 0; pass < kRows / 16; ++pass) {
    const int r = lr + 16 * pass, i = q0 + r;
    const __nv_bfloat16* src = p.q + static_cast<int64_t>(i) * p.q_stride + static_cast<int64_t>(h) * qk_dim;
    const uint32_t dst = SmemAddr(sQ + r * SK);
#pragma unroll
    for (int c = lc; c < DK / 8; c += 8) {
      const bool valid = i < p.num_q && c * 8 < qk_dim;
      CpAsync16(dst + c * 16, valid ? src + c * 8 : p.q, valid);
    }
  }
  auto load_tile = [&](int tile, int buf) {
#pragma unroll
    for (int pass = 0; pass < kKeys / 16; ++pass) {
      const int r = lr + 16 * pass, key = tile * kKeys + r;
      const bool row_ok = key < p.num_kv;
      const __nv_bfloat16* kn = p.k_nope + static_cast<int64_t>(key) * p.k_nope_stride + h * args.k_head_stride;
      const __nv_bfloat16* kr = p.k_rope + static_cast<int64_t>(key) * p.k_rope_stride;
      const __nv_bfloat16* vv = p.v + static_cast<int64_t>(key) * p.v_stride + h * args.v_head_stride;
      const uint32_t kdst = SmemAddr(sK + (buf * kKeys + r) * SK);
      const uint32_t vdst = SmemAddr(sV + (buf * kKeys + r) * SV);
#pragma unroll
      for (int c = lc; c < DK / 8; c += 8) {
        const int col = c * 8;
        const bool nope = col < p.nope_dim, rope = !nope && col < qk_dim;
        const bool valid = row_ok && (nope || rope);
        CpAsync16(kdst + c * 16, !valid ? p.k_nope : nope ? kn + col : kr + (col - p.nope_dim), valid);
      }
#pragma unroll
      for (int c = lc; c < DV / 8; c += 8) {
        const bool valid = row_ok && c * 8 < p.v_dim;
        CpAsync16(vdst + c * 16, valid ? vv + c * 8 : p.v, valid);
      }
    }
  };
  load_tile(0, 0);
  CpAsyncCommit();
  if (tiles > 1) load_tile(1, 1);
  CpAsyncCommit();

  // Rows g and g + 8 of this warp's 16; key limits (causal, and inside num_kv).
  const int i0 = q0 + 16 * warp + g;
  const int lim0 = min(args.offset + i0, p.num_kv - 1), lim1 = min(args.offset + i0 + 8, p.num_kv - 1);
  float o[VN][4];
#pragma unroll
  for (int n = 0; n < VN; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  uint32_t qf[KS][4];

  for (int j = 0; j < tiles; ++j) {
    const int buf = j & 1;
    CpAsyncWait<1>();
    __syncthreads();
    if (j == 0) {
      const uint32_t qa = SmemAddr(sQ + (16 * warp + lane % 16) * SK + 8 * (lane / 16));
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) Ldmatrix4(qa + ks * 32, qf[ks]);
    }
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    const uint32_t kb = SmemAddr(sK + (buf * kKeys + lane % 8 + 8 * (lane / 16)) * SK + 8 * ((lane / 8) % 2));
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        Ldmatrix4(kb + (np * 16 * SK) * 2 + ks * 32, b);
        Mma16816(s[2 * np], qf[ks], b[0], b[1]);
        Mma16816(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }
    // s[n][e]: row g (+8 for e >= 2), key j*64 + 8n + 2t + (e & 1).
    const bool masked = (j + 1) * kKeys - 1 > lim0;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * args.scale_log2;
        if (masked && j * kKeys + 8 * n + 2 * t + (e & 1) > (e < 2 ? lim0 : lim1)) v = -INFINITY;
        s[n][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float ms0 = mn0 == -INFINITY ? 0.0f : mn0, ms1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float alpha0 = Exp2(m0 - ms0), alpha1 = Exp2(m1 - ms1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = Exp2(s[n][0] - ms0);
      s[n][1] = Exp2(s[n][1] - ms0);
      s[n][2] = Exp2(s[n][2] - ms1);
      s[n][3] = Exp2(s[n][3] - ms1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < VN; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }
    const uint32_t vb = SmemAddr(sV + (buf * kKeys + lane % 8 + 8 * ((lane / 8) % 2)) * SV + 8 * (lane / 16));
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
                              PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int vp = 0; vp < VN / 2; ++vp) {
        uint32_t b[4];
        Ldmatrix4Trans(vb + (kk * 16 * SV + vp * 16) * 2, b);
        Mma16816(o[2 * vp], pa, b[0], b[1]);
        Mma16816(o[2 * vp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();
    if (j + 2 < tiles) load_tile(j + 2, buf);
    CpAsyncCommit();
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = i0 + 8 * hh;
    if (i >= p.num_q) continue;
    float* out = p.out + static_cast<int64_t>(i) * p.out_stride + static_cast<int64_t>(h) * p.v_dim;
    const float inv = hh == 0 ? inv0 : inv1;
#pragma unroll
    for (int n = 0; n < VN; ++n) {
      const int col = 8 * n + 2 * t;
      if (col < p.v_dim) {
        *reinterpret_cast<float2*>(out + col) = make_float2(o[n][2 * hh] * inv, o[n][2 * hh + 1] * inv);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// sm_90a kernel for the DeepSeek widths (nope 128 + rope 64 = 192, v 128): wgmma, two
// warpgroups of 64 query rows each (128 queries per thread block) sharing the K and V
// tiles. Q (3 atoms per warpgroup), K (3 atoms) and V (2 atoms) sit in shared memory in
// the 128-byte-swizzled layout (8 KB atoms of [64 rows][64 columns], 16-byte chunk c of
// row r at (c ^ (r % 8)) * 16). Per tile: S = Q K^T (12 x m64n64k16), online softmax in
// registers, P (bf16, registers) · V (m64n128k16, V read MN-major).

constexpr int kWgQk = 192, kWgNope = 128, kWgV = 128;
constexpr int kWgRows = 128;  // queries per thread block
constexpr int kAtom = 64 * 128;
constexpr int kWgSmem = 2 * 3 * kAtom      // Q, two warpgroups
                        + 2 * 3 * kAtom    // K, two stages
                        + 2 * 2 * kAtom    // V, two stages
                        + 1024;            // alignment slack


#ifdef TANDEM_HAS_WGMMA
using namespace wgmma;  // NOLINT: the kernel below is written in these building blocks

__device__ __forceinline__ void WgmmaM64N128K16RegATransB(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return wgmma::SwizzledOffset(row, chunk, kAtom);
}
#endif  // TANDEM_HAS_WGMMA


__global__ void __launch_bounds__(256, 1) MlaPrefillWgmmaKernel(PrefillArgs args) {
#ifdef TANDEM_HAS_WGMMA
  const MlaPrefillParams& p = args.p;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_addr = SmemAddr(smem_raw);
  const uint32_t base = raw_addr + (((raw_addr + 1023) & ~1023u) - raw_addr);
  const uint32_t q_addr = base;                    // [warpgroup][3 atoms]
  const uint32_t k_addr0 = base + 6 * kAtom;       // [stage][3 atoms]
  const uint32_t v_addr0 = base + 12 * kAtom;      // [stage][2 atoms]

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int ww = (tid % 128) / 32;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kWgRows;  // longest query tiles first
  const int h = blockIdx.y;
  const int last_key = min(p.num_kv - 1, args.offset + min(q0 + kWgRows, p.num_q) - 1);
  const int tiles = last_key / kKeys + 1;

  // Loads: 8 threads per row, each 16 bytes of every 128-byte segment, 32 rows per pass.
  const int lr = tid / 8, lc = tid % 8;
#pragma unroll
  for (int pass = 0; pass < kWgRows / 32; ++pass) {
    const int r = lr + 32 * pass, i = q0 + r;
    const bool valid = i < p.num_q;
    const __nv_bfloat16* src = valid ? p.q + static_cast<int64_t>(i) * p.q_stride + static_cast<int64_t>(h) * kWgQk : p.q;
    const uint32_t dst = q_addr + (r / 64) * 3 * kAtom;
#pragma unroll
    for (int c = lc; c < kWgQk / 8; c += 8) CpAsync16(dst + SwizzledOffset(r % 64, c), src + c * 8, valid);
  }
  auto load_tile = [&](int tile, int buf) {
#pragma unroll
    for (int pass = 0; pass < kKeys / 32; ++pass) {
      const int r = lr + 32 * pass, key = tile * kKeys + r;
      const bool valid = key < p.num_kv;
      const __nv_bfloat16* kn = valid ? p.k_nope + static_cast<int64_t>(key) * p.k_nope_stride + h * args.k_head_stride : p.k_nope;
      const __nv_bfloat16* kr = valid ? p.k_rope + static_cast<int64_t>(key) * p.k_rope_stride : p.k_nope;
      const __nv_bfloat16* vv = valid ? p.v + static_cast<int64_t>(key) * p.v_stride + h * args.v_head_stride : p.v;
      const uint32_t kdst = k_addr0 + buf * 3 * kAtom, vdst = v_addr0 + buf * 2 * kAtom;
#pragma unroll
      for (int c = lc; c < kWgQk / 8; c += 8) {
        const __nv_bfloat16* src = c < kWgNope / 8 ? kn + c * 8 : kr + (c - kWgNope / 8) * 8;
        CpAsync16(kdst + SwizzledOffset(r, c), valid ? src : p.k_nope, valid);
      }
#pragma unroll
      for (int c = lc; c < kWgV / 8; c += 8) CpAsync16(vdst + SwizzledOffset(r, c), vv + (valid ? c * 8 : 0), valid);
    }
  };
  load_tile(0, 0);
  CpAsyncCommit();
  if (tiles > 1) load_tile(1, 1);
  CpAsyncCommit();

  // Accumulators: value 4*j + e is row 16*ww + g (+8 for e >= 2) of the warpgroup's 64,
  // column 8*j + 2*t + (e & 1).
  const int i0 = q0 + 64 * wg + 16 * ww + g;  // query of rows r0; r1 = r0 + 8
  const int lim0 = min(args.offset + i0, p.num_kv - 1), lim1 = min(args.offset + i0 + 8, p.num_kv - 1);
  const int wg_last_key = args.offset + q0 + 64 * wg + 63;  // no key past this for any row of this warpgroup
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const uint32_t qa = q_addr + wg * 3 * kAtom;

  for (int j = 0; j < tiles; ++j) {
    const int buf = j & 1;
    CpAsyncWait<1>();
    FenceProxyAsync();
    __syncthreads();
    if (j * kKeys <= wg_last_key) {  // warpgroup-uniform: some row sees this tile
      const uint32_t ka = k_addr0 + buf * 3 * kAtom, va = v_addr0 + buf * 2 * kAtom;
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kWgQk / 16; ++k) {
        const uint32_t off = (k >> 2) * kAtom + (k & 3) * 32;
        WgmmaM64N64K16(s, SmemDesc(qa + off, 16, 1024), SmemDesc(ka + off, 16, 1024), k > 0 ? 1 : 0);
      }
      WgmmaCommit();
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) FenceReg(s[i]);

      const bool masked = (j + 1) * kKeys - 1 > lim0;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[4 * n + e] * args.scale_log2;
          if (masked && j * kKeys + 8 * n + 2 * t + (e & 1) > (e < 2 ? lim0 : lim1)) v = -INFINITY;
          s[4 * n + e] = v;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float ms0 = mn0 == -INFINITY ? 0.0f : mn0, ms1 = mn1 == -INFINITY ? 0.0f : mn1;
      const float alpha0 = Exp2(m0 - ms0), alpha1 = Exp2(m1 - ms1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.0f, sum1 = 0.0f;
      uint32_t pa[4][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float p0 = Exp2(s[4 * n] - ms0), p1 = Exp2(s[4 * n + 1] - ms0);
        const float p2 = Exp2(s[4 * n + 2] - ms1), p3 = Exp2(s[4 * n + 3] - ms1);
        sum0 += p0 + p1;
        sum1 += p2 + p3;
        // A fragment of key step n / 2: (row r0, keys 2t..), (r1, 2t..), (r0, 2t+8..), (r1, 2t+8..).
        pa[n / 2][(n % 2) * 2] = PackBf16(p0, p1);
        pa[n / 2][(n % 2) * 2 + 1] = PackBf16(p2, p3);
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
      if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {  // some row's maximum moved
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          o[4 * n] *= alpha0;
          o[4 * n + 1] *= alpha0;
          o[4 * n + 2] *= alpha1;
          o[4 * n + 3] *= alpha1;
        }
      }
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        WgmmaM64N128K16RegATransB(o, pa[kk], SmemDesc(va + kk * 16 * 128, kAtom, 1024));
      }
      WgmmaCommit();
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) FenceReg(o[i]);
    }
    __syncthreads();
    if (j + 2 < tiles) load_tile(j + 2, buf);
    CpAsyncCommit();
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = i0 + 8 * hh;
    if (i >= p.num_q) continue;
    const float l = hh == 0 ? l0 : l1;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* out = p.out + static_cast<int64_t>(i) * p.out_stride + static_cast<int64_t>(h) * kWgV;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      *reinterpret_cast<float2*>(out + 8 * n + 2 * t) = make_float2(o[4 * n + 2 * hh] * inv, o[4 * n + 2 * hh + 1] * inv);
    }
  }
#else
  __trap();  // built only for sm_90a; the launcher never selects it elsewhere
#endif
}

template <int KS, int VN>
cudaError_t Launch(const PrefillArgs& args, cudaStream_t stream) {
  constexpr size_t kSmem =
      (kRows * (KS * 16 + 8) + 2 * kKeys * (KS * 16 + 8) + 2 * kKeys * (VN * 8 + 8)) * sizeof(__nv_bfloat16);
  const cudaError_t err =
      cudaFuncSetAttribute(MlaPrefillKernel<KS, VN>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  if (err != cudaSuccess) return err;
  const dim3 grid((args.p.num_q + kRows - 1) / kRows, args.p.num_heads);
  MlaPrefillKernel<KS, VN><<<grid, kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t MlaPrefillAttention(const MlaPrefillParams& p, cudaStream_t stream) {
  if (p.num_q == 0) return cudaSuccess;
  const int qk = p.nope_dim + p.rope_dim;
  const int64_t k_head = p.k_nope_head_stride > 0 ? p.k_nope_head_stride : p.nope_dim;
  const int64_t v_head = p.v_head_stride > 0 ? p.v_head_stride : p.v_dim;
  if (p.num_q < 0 || p.num_kv < p.num_q || p.num_heads < 1 || p.num_heads > 65535 || p.nope_dim < 0 ||
      p.nope_dim > 192 || p.nope_dim % 16 != 0 || p.rope_dim < 0 || p.rope_dim > 64 || p.rope_dim % 16 != 0 ||
      qk == 0 || p.v_dim < 16 || p.v_dim > 192 || p.v_dim % 16 != 0 || p.q == nullptr || p.k_nope == nullptr ||
      (p.k_rope == nullptr && p.rope_dim > 0) || p.v == nullptr || p.out == nullptr || !Aligned16(p.q) || !Aligned16(p.k_nope) ||
      !Aligned16(p.k_rope) || !Aligned16(p.v) || reinterpret_cast<uintptr_t>(p.out) % 8 != 0 ||
      p.q_stride < static_cast<int64_t>(p.num_heads) * qk || p.q_stride % 8 != 0 ||
      p.k_nope_stride < (p.num_heads - 1) * k_head + p.nope_dim || p.k_nope_stride % 8 != 0 ||
      k_head < p.nope_dim || k_head % 8 != 0 || p.k_rope_stride < p.rope_dim || p.k_rope_stride % 8 != 0 ||
      p.v_stride < (p.num_heads - 1) * v_head + p.v_dim || p.v_stride % 8 != 0 || v_head < p.v_dim ||
      v_head % 8 != 0 ||
      p.out_stride < static_cast<int64_t>(p.num_heads) * p.v_dim || p.out_stride % 2 != 0 || p.impl < 0 ||
      p.impl > 2) {
    return cudaErrorInvalidValue;
  }
  const PrefillArgs args{p, p.num_kv - p.num_q, p.softmax_scale * kLog2e, k_head, v_head};
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    return cudaGetLastError();
  }
  const bool wgmma_ok = major == 9 && p.nope_dim == kWgNope && p.rope_dim == kWgQk - kWgNope && p.v_dim == kWgV;
  if (p.impl == 2 && !wgmma_ok) return cudaErrorInvalidValue;
  if (wgmma_ok && p.impl != 1) {
    const cudaError_t err =
        cudaFuncSetAttribute(MlaPrefillWgmmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem);
    if (err != cudaSuccess) return err;
    const dim3 grid((p.num_q + kWgRows - 1) / kWgRows, p.num_heads);
    MlaPrefillWgmmaKernel<<<grid, 256, kWgSmem, stream>>>(args);
    return cudaGetLastError();
  }
  // Widths zero-padded to the smallest instantiation that holds them.
  if (qk <= 64 && p.v_dim <= 64) return Launch<4, 8>(args, stream);
  if (qk <= 192 && p.v_dim <= 128) return Launch<12, 16>(args, stream);
  return Launch<16, 24>(args, stream);
}

}  // namespace tandem::cuda
