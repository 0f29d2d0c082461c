#include "kernels/cuda/fp4_expert_gemv.h"

#include <algorithm>
#include <atomic>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/narrow_widen.cuh"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads (32 codes) a lane and row a stage; two stages in flight
constexpr int kValues = 32;  // codes of a load: one scale group
constexpr int64_t kMaxStagedBytes = 200 * 1024;
constexpr int64_t kTwoBlocksBytes = 96 * 1024;  // staged x up to this: two blocks a multiprocessor

template <int kLanes>
inline constexpr int kPairs = kThreads / kLanes;
template <int kLanes>
inline constexpr int kTileRows = 2 * kPairs<kLanes>;
template <int kLanes>
inline constexpr int kPassChunks = kLanes * kUnroll;  // loads of a row a pass

// A tile's expert matrix (codes and scales), or null codes for an id outside the experts.
struct TileMatrix {
  const uint8_t* w;
  const float* scales;
  int problem;
  int tile;
};

__device__ __forceinline__ TileMatrix MatrixOf(const QuantizedGemvParams& p, int j, int tiles) {
  TileMatrix t{nullptr, nullptr, j / tiles, j % tiles};
  const int32_t id = __ldg(p.ids + t.problem);
  if (id >= 0 && id < p.num_experts) {
    t.w = p.experts[id].w;
    t.scales = p.experts[id].scales;
  }
  return t;
}

// This lane's loads (codes and their scales) of one pass over its pair's two rows.
template <int kLanes>
__device__ __forceinline__ void LoadPass(const QuantizedGemvParams& p, const TileMatrix& t, int pass, int kc,
                                         uint4 (&wv)[2][kUnroll], float (&sv)[2][kUnroll]) {
  const int pair = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t row = static_cast<int64_t>(t.tile) * kTileRows<kLanes> + 2 * pair;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int ch = pass * kPassChunks<kLanes> + u * kLanes + lane;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (ch < kc && t.w != nullptr) {
        wv[r][u] = LoadStreamed(reinterpret_cast<const uint4*>(t.w + (row + r) * (p.k / 2)) + ch);
        sv[r][u] = __ldg(t.scales + (row + r) * kc + ch);
      } else {
        wv[r][u] = make_uint4(0, 0, 0, 0);
        sv[r][u] = 0.0f;
      }
    }
  }
}

// acc[r] += this lane's part of row r's product with x row xr over one pass. xs holds the x
// rows as 8 planes of float4s a row, [row][plane][kc]: a load's 32 values meet plane q's
// float4 at 4 q, and a pair's lanes read consecutive float4s.
template <int kLanes>
__device__ __forceinline__ void ComputePass(const float4* xs, int kc, int xr, int pass, const uint4 (&wv)[2][kUnroll],
                                            const float (&sv)[2][kUnroll], float (&acc)[2]) {
  const int lane = threadIdx.x % kLanes;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int ch = pass * kPassChunks<kLanes> + u * kLanes + lane;
    if (ch < kc) {
      float sum[2] = {0.0f, 0.0f};
      const uint32_t words[2][4] = {{wv[0][u].x, wv[0][u].y, wv[0][u].z, wv[0][u].w},
                                    {wv[1][u].x, wv[1][u].y, wv[1][u].z, wv[1][u].w}};
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // a word: 8 values, planes 2q and 2q + 1
        const float4 a = xs[(xr * 8 + 2 * q) * kc + ch], b = xs[(xr * 8 + 2 * q + 1) * kc + ch];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float w[8];
          WidenFp4Word(words[r][q], w);
          float s = sum[r];
          s = fmaf(w[0], a.x, s);
          s = fmaf(w[1], a.y, s);
          s = fmaf(w[2], a.z, s);
          s = fmaf(w[3], a.w, s);
          s = fmaf(w[4], b.x, s);
          s = fmaf(w[5], b.y, s);
          s = fmaf(w[6], b.z, s);
          s = fmaf(w[7], b.w, s);
          sum[r] = s;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) acc[r] = fmaf(sum[r], sv[r][u] * 16384.0f, acc[r]);  // WidenFp4's 2^-14 undone
    }
  }
}

template <int kLanes>
__global__ void __launch_bounds__(kThreads, 2) Fp4ExpertGemvKernel(QuantizedGemvParams p) {
  extern __shared__ float4 xs[];  // [x rows][8][kc]
  const int tid = threadIdx.x, pair = tid / kLanes, lane = tid % kLanes;
  const int kc = static_cast<int>(p.k / kValues);
  const int passes = (kc + kPassChunks<kLanes> - 1) / kPassChunks<kLanes>;
  const int tiles = static_cast<int>(p.n / kTileRows<kLanes>);
  const int total = p.problems * tiles;
  const int x_rows = (p.problems + p.x_group - 1) / p.x_group;
  const int stride = static_cast<int>(gridDim.x);

  GridDependencyWait();  // the expert ids (and x) come from the kernels before
  for (int i = tid; i < x_rows * 8 * kc; i += kThreads) {
    const int m = i / (8 * kc), q = (i / kc) % 8, ch = i % kc;
    xs[i] = *reinterpret_cast<const float4*>(p.x + static_cast<int64_t>(m) * p.ldx + ch * kValues + 4 * q);
  }
  // The block's stream of stages (tile j, pass), two in flight: one's loads are issued
  // before the other's products, so a warp's memory and arithmetic overlap.
  struct Stage {
    int j, pass;
    TileMatrix t;
  };
  auto advance = [&](const Stage& s) {
    Stage n{s.j, s.pass + 1, s.t};
    if (n.pass == passes) {
      n.pass = 0;
      n.j += stride;
      if (n.j < total) n.t = MatrixOf(p, n.j, tiles);
    }
    return n;
  };
  uint4 wa[2][kUnroll], wb[2][kUnroll];
  float sa[2][kUnroll], sb[2][kUnroll];
  Stage a{static_cast<int>(blockIdx.x), 0, {}};
  if (a.j < total) {
    a.t = MatrixOf(p, a.j, tiles);
    LoadPass<kLanes>(p, a.t, 0, kc, wa, sa);
  }
  __syncthreads();
  TriggerDependentLaunch();

  float acc[2] = {0.0f, 0.0f};
  // Stage s's products; its tile's sums written after its last pass.
  auto finish = [&](const Stage& s, const uint4 (&w)[2][kUnroll], const float (&sc)[2][kUnroll]) {
    ComputePass<kLanes>(xs, kc, s.t.problem / p.x_group, s.pass, w, sc, acc);
    if (s.pass + 1 < passes) return;
    const float v0 = LaneGroupSum<kLanes>(acc[0]), v1 = LaneGroupSum<kLanes>(acc[1]);
    if (lane == 0) {
      float2* out = reinterpret_cast<float2*>(p.y + static_cast<int64_t>(s.t.problem) * p.ldy +
                                              static_cast<int64_t>(s.t.tile) * kTileRows<kLanes> + 2 * pair);
      if (p.accumulate) {
        const float2 old = *out;
        *out = make_float2(old.x + v0, old.y + v1);
      } else {
        *out = make_float2(v0, v1);
      }
    }
    acc[0] = acc[1] = 0.0f;
  };
  while (a.j < total) {
    const Stage b = advance(a);
    if (b.j < total) LoadPass<kLanes>(p, b.t, b.pass, kc, wb, sb);
    finish(a, wa, sa);
    if (b.j >= total) break;
    a = advance(b);
    if (a.j < total) LoadPass<kLanes>(p, a.t, a.pass, kc, wa, sa);
    finish(b, wb, sb);
  }
}

// Lanes a row pair: the narrowest whose pass a row still fills (2048, 1024, 512 columns).
int LanesFor(int64_t k) {
  const int64_t kc = k / kValues;
  return kc >= kPassChunks<16> ? 16 : kc >= kPassChunks<8> ? 8 : 4;
}

int64_t StagedBytes(const QuantizedGemvParams& p) {
  return static_cast<int64_t>((p.problems + p.x_group - 1) / p.x_group) * p.k * static_cast<int64_t>(sizeof(float));
}

template <int kLanes>
cudaError_t LaunchLanes(const QuantizedGemvParams& p, cudaStream_t stream) {
  const int64_t smem = StagedBytes(p);
  static std::atomic<bool> configured{false};  // the dynamic shared memory limit raised once
  if (!configured.load(std::memory_order_relaxed)) {
    const cudaError_t e =
        cudaFuncSetAttribute(Fp4ExpertGemvKernel<kLanes>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kMaxStagedBytes));
    if (e != cudaSuccess) return e;
    configured.store(true, std::memory_order_relaxed);
  }
  const int per_sm = smem <= kTwoBlocksBytes ? 2 : 1;
  const int64_t total = static_cast<int64_t>(p.problems) * (p.n / kTileRows<kLanes>);
  const int64_t blocks = std::min<int64_t>(total, static_cast<int64_t>(per_sm) * CurrentDeviceMultiprocessors());
  return Launch(Fp4ExpertGemvKernel<kLanes>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                static_cast<size_t>(smem), stream, p);
}

}  // namespace

bool Fp4ExpertGemvApplies(const QuantizedGemvParams& p) {
  if (p.experts == nullptr || p.format != QuantizedWeight::kFp4Group32 || !p.expert_tiles || p.m != 1 ||
      p.k % kValues != 0 || p.k <= 0 || p.n <= 0 || p.problems < 1 || p.x_group < 1) {
    return false;
  }
  const int64_t tile_rows = 2 * (kThreads / LanesFor(p.k));
  return p.n % tile_rows == 0 && p.n / tile_rows * p.problems <= (int64_t{1} << 30) &&
         StagedBytes(p) <= kMaxStagedBytes && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.ldx % 4 == 0 &&
         reinterpret_cast<uintptr_t>(p.y) % 8 == 0 && p.ldy % 2 == 0;
}

cudaError_t LaunchFp4ExpertGemv(const QuantizedGemvParams& p, cudaStream_t stream) {
  if (!Fp4ExpertGemvApplies(p)) return cudaErrorInvalidValue;
  switch (LanesFor(p.k)) {
    case 16: return LaunchLanes<16>(p, stream);
    case 8: return LaunchLanes<8>(p, stream);
    default: return LaunchLanes<4>(p, stream);
  }
}

}  // namespace tandem::cuda::internal
