// DeepSeek-V4's manifold-constrained hyper-connections (mHC) on the GPU: a token's
// residual is hc_mult streams of `dim` values; each layer's attention and MoE sites
// collapse them into one input (weights `pre`) and expand the site's output back into the
// streams (weights `post`, and `comb`, Sinkhorn-normalized towards a doubly stochastic
// matrix). The per-token weights come from a row `mix` = fn . UnitRmsNorm(streams), a small
// projection the caller computes (a GEMM at prefill shapes). The same arithmetic as
// engine/model/deepseek_v4/v4_math.cc (HyperConnectionMix, HyperHeadMix, CollapseStreams,
// ExpandStreams), float32 throughout, in the same order of operations.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

// The largest hc_mult the kernels take (V4 and V4.1 use 4).
inline constexpr int kMaxHyperStreams = 8;

struct HyperMixParams {
  const float* mix = nullptr;  // [tokens][mix_stride]: 2n + n*n values used (n for a head mix)
  int64_t mix_stride = 0;
  const float* base = nullptr;   // [2n + n*n] (n for a head mix)
  const float* scale = nullptr;  // [3] (scale[0] only for a head mix)
  int64_t tokens = 0;
  int n = 0;               // hc_mult, 1..kMaxHyperStreams
  int sinkhorn_iters = 0;  // >= 1 (unused for a head mix)
  float eps = 0.0f;        // hc_eps
  bool head = false;       // the final collapse's mix: pre only
  float* pre = nullptr;    // [tokens][n]
  float* post = nullptr;   // [tokens][n]     (not for a head mix)
  float* comb = nullptr;   // [tokens][n][n]  (not for a head mix; row-major, comb[j][k])
};

// pre = sigmoid(mix * scale + base) + eps; post = 2 sigmoid(...); comb = softmax rows + eps,
// then columns, then sinkhorn_iters - 1 rounds of rows and columns.
cudaError_t HyperMix(const HyperMixParams& p, cudaStream_t stream);

struct HyperCollapseParams {
  const float* streams = nullptr;  // [tokens][n][dim]
  const float* pre = nullptr;      // [tokens][n]
  int64_t tokens = 0;
  int n = 0;
  int64_t dim = 0;
  float* out = nullptr;  // [tokens][out_stride]: out[i] = sum_j pre_j streams[j][i], j ascending
  int64_t out_stride = 0;
};

cudaError_t HyperCollapse(const HyperCollapseParams& p, cudaStream_t stream);

struct HyperExpandParams {
  float* streams = nullptr;   // [tokens][n][dim], updated in place
  const float* post = nullptr;  // [tokens][n]
  const float* comb = nullptr;  // [tokens][n][n]
  const float* f = nullptr;     // [tokens][f_stride]: the site's output
  int64_t f_stride = 0;
  int64_t tokens = 0;
  int n = 0;
  int64_t dim = 0;
};

// streams[k][i] = post_k f[i] + sum_j comb[j][k] streams[j][i] (j ascending; every stream
// of a channel read before any is written).
cudaError_t HyperExpand(const HyperExpandParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
