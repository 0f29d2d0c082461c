#include "kernels/cuda/sink_attention.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A split gives each warp at least two keys; fewer and the merge costs more than the keys.
constexpr int kMinKeysPerSplit = 2 * kWarps;
constexpr int kMaxSplits = 64;

// How a launch divides the work: `chunks` 128-channel slices a lane row covers (a lane
// holds 4 channels of each), `heads_per_block` query heads served by one read of a key,
// `splits` slices of the key list (each `keys_per_split` keys) merged by a second kernel.
struct Plan {
  int chunks = 1;
  int heads_per_block = 4;
  int groups = 1;
  int splits = 1;
  int keys_per_split = 0;
};

Plan MakePlan(int64_t tokens, int heads, int head_dim, int max_keys, int64_t partial_floats, int sms) {
  Plan plan;
  const int slices = (head_dim + 127) / 128;
  while (plan.chunks < slices) plan.chunks *= 2;
  // q and the sums of every head a block serves live in registers: fewer heads for wider ones.
  plan.heads_per_block = plan.chunks >= 8 ? 2 : 4;
  plan.groups = (heads + plan.heads_per_block - 1) / plan.heads_per_block;
  const int64_t base = static_cast<int64_t>(plan.groups) * tokens;
  plan.keys_per_split = std::max(max_keys, 1);
  if (base >= sms || max_keys < 2 * kMinKeysPerSplit) return plan;
  int64_t splits = std::min<int64_t>({(sms + base - 1) / base, max_keys / kMinKeysPerSplit, kMaxSplits});
  const int64_t per_split_floats = tokens * heads * (static_cast<int64_t>(head_dim) + 2);
  splits = std::min<int64_t>(splits, partial_floats / std::max<int64_t>(per_split_floats, 1));
  if (splits < 2) return plan;
  int kps = static_cast<int>((max_keys + splits - 1) / splits);
  kps = (kps + kWarps - 1) / kWarps * kWarps;
  plan.keys_per_split = kps;
  plan.splits = (max_keys + kps - 1) / kps;
  return plan;
}

__device__ __forceinline__ bool Misplaced(const float* k) {
  return k == nullptr || reinterpret_cast<uintptr_t>(k) % 16 != 0;  // float4 loads below
}

// Every block of a token checks the token's whole list (a few KB of pointers), so that
// every split of a bad token knows it without a second pass.
__device__ __forceinline__ bool BadList(const SinkAttentionParams& p, int64_t t, int n) {
  bool bad = n < 0 || n > p.max_keys;
  const float* const* keys = p.keys + t * p.max_keys;
  for (int j = threadIdx.x; !bad && j < n; j += kThreads) bad = Misplaced(keys[j]);
  return __syncthreads_or(bad);
}

__device__ __forceinline__ float* PartialAcc(const SinkAttentionParams& p, int64_t t, int h, int split, int splits) {
  return p.partials + ((t * p.heads + h) * splits + split) * p.head_dim;
}

__device__ __forceinline__ float* PartialMaxSum(const SinkAttentionParams& p, int64_t t, int h, int split,
                                                int splits) {
  return p.partials + p.tokens * p.heads * splits * p.head_dim + ((t * p.heads + h) * splits + split) * 2;
}

// Grid (splits, head groups, tokens). Each warp walks every kWarps-th key of the block's
// slice, reading the key once for the block's kHeads heads and folding it into a running
// softmax per head (max, sum of weights, weighted keys); the warps' states are merged in
// shared memory. With one split the block also folds in the sink and writes the output;
// otherwise it writes its slice's state for SinkAttentionMergeKernel.
template <int kChunks, int kHeads>
__global__ void __launch_bounds__(kThreads, 1) SinkAttentionKernel(SinkAttentionParams p, int splits,
                                                                     int keys_per_split) {
  extern __shared__ float smem[];
  internal::WaitAndTrigger();
  constexpr int kWidth = kChunks * 128;
  const int split = blockIdx.x, h0 = blockIdx.y * kHeads;
  const int64_t t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = p.head_dim;
  const int n = p.num_keys[t];
  if (BadList(p, t, n)) {
    if (threadIdx.x == 0 && p.bad_input != nullptr) atomicExch(p.bad_input, 1);
    for (int i = threadIdx.x; i < kHeads * d; i += kThreads) {
      const int h = h0 + i / d;
      if (h >= p.heads) continue;
      if (splits == 1) {
        p.out[(t * p.heads + h) * d + i % d] = 0.0f;
      } else if (i % d == 0) {
        float* ml = PartialMaxSum(p, t, h, split, splits);
        ml[0] = -INFINITY;
        ml[1] = -1.0f;  // no real sum is negative: the merge writes zeros
      }
    }
    return;
  }
  float q[kHeads][kChunks][4], acc[kHeads][kChunks][4], m[kHeads], l[kHeads];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int ch = c * 128 + lane * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h0 + h < p.heads && ch < d) v = *reinterpret_cast<const float4*>(p.q + (t * p.heads + h0 + h) * d + ch);
      q[h][c][0] = v.x, q[h][c][1] = v.y, q[h][c][2] = v.z, q[h][c][3] = v.w;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][c][e] = 0.0f;
    }
  }
  const float* const* keys = p.keys + t * p.max_keys;
  const int begin = min(n, split * keys_per_split), end = min(n, begin + keys_per_split);
  auto load = [&](int j, float4 (&kv)[kChunks]) {
    const float* k = keys[j];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int ch = c * 128 + lane * 4;
      kv[c] = ch < d ? *reinterpret_cast<const float4*>(k + ch) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  float4 cur[kChunks];
  if (begin + warp < end) load(begin + warp, cur);
  for (int j = begin + warp; j < end; j += kWarps) {
    float4 next[kChunks];
    if (j + kWarps < end) load(j + kWarps, next);  // in flight while this key is folded in
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        s = fmaf(q[h][c][0], cur[c].x, s);
        s = fmaf(q[h][c][1], cur[c].y, s);
        s = fmaf(q[h][c][2], cur[c].z, s);
        s = fmaf(q[h][c][3], cur[c].w, s);
      }
      s = internal::WarpSum(s) * p.scale;
      if (s > m[h]) {  // warp-uniform: every lane holds the same s
        const float shrink = expf(m[h] - s);
        l[h] *= shrink;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[h][c][e] *= shrink;
        }
        m[h] = s;
      }
      const float w = expf(s - m[h]);
      l[h] += w;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        acc[h][c][0] = fmaf(w, cur[c].x, acc[h][c][0]);
        acc[h][c][1] = fmaf(w, cur[c].y, acc[h][c][1]);
        acc[h][c][2] = fmaf(w, cur[c].z, acc[h][c][2]);
        acc[h][c][3] = fmaf(w, cur[c].w, acc[h][c][3]);
      }
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) cur[c] = next[c];
  }
  // The warps' states: [warp][head][channel], then [warp][head] maxima and sums, then per
  // head the merged max, sum and each warp's factor.
  float* w_acc = smem;
  float* w_max = w_acc + kWarps * kHeads * kWidth;
  float* w_sum = w_max + kWarps * kHeads;
  float* factor = w_sum + kWarps * kHeads;  // [head][warp]
  float* merged = factor + kHeads * kWarps;  // [head]: max, sum
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      *reinterpret_cast<float4*>(w_acc + (warp * kHeads + h) * kWidth + c * 128 + lane * 4) =
          make_float4(acc[h][c][0], acc[h][c][1], acc[h][c][2], acc[h][c][3]);
    }
    if (lane == 0) {
      w_max[warp * kHeads + h] = m[h];
      w_sum[warp * kHeads + h] = l[h];
    }
  }
  __syncthreads();
  const bool final_here = splits == 1;
  if (threadIdx.x < kHeads && h0 + static_cast<int>(threadIdx.x) < p.heads) {
    const int h = threadIdx.x;
    const float sink = final_here ? p.sinks[h0 + h] : -INFINITY;
    float mx = sink;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, w_max[w * kHeads + h]);
    float sum = mx == -INFINITY ? 0.0f : expf(sink - mx);
    for (int w = 0; w < kWarps; ++w) {
      const float f = w_max[w * kHeads + h] == -INFINITY ? 0.0f : expf(w_max[w * kHeads + h] - mx);
      factor[h * kWarps + w] = f;
      sum = fmaf(w_sum[w * kHeads + h], f, sum);
    }
    merged[2 * h] = mx;
    merged[2 * h + 1] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kHeads * d; i += kThreads) {
    const int h = i / d, ch = i % d;
    if (h0 + h >= p.heads) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v = fmaf(w_acc[(w * kHeads + h) * kWidth + ch], factor[h * kWarps + w], v);
    if (final_here) {
      p.out[(t * p.heads + h0 + h) * d + ch] = v / merged[2 * h + 1];
    } else {
      PartialAcc(p, t, h0 + h, split, splits)[ch] = v;
      if (ch == 0) {
        float* ml = PartialMaxSum(p, t, h0 + h, split, splits);
        ml[0] = merged[2 * h];
        ml[1] = merged[2 * h + 1];
      }
    }
  }
}

// Grid (heads, tokens): the splits' states of one head merged with the sink.
__global__ void SinkAttentionMergeKernel(SinkAttentionParams p, int splits) {
  __shared__ float factor[kMaxSplits];
  __shared__ float total;
  internal::WaitAndTrigger();
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int d = p.head_dim;
  float* out = p.out + (t * p.heads + h) * d;
  if (PartialMaxSum(p, t, h, 0, splits)[1] < 0.0f) {  // a bad list: every split said so
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = 0.0f;
    return;
  }
  if (threadIdx.x == 0) {
    const float sink = p.sinks[h];
    float mx = sink;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, PartialMaxSum(p, t, h, s, splits)[0]);
    float sum = mx == -INFINITY ? 0.0f : expf(sink - mx);
    for (int s = 0; s < splits; ++s) {
      const float* ml = PartialMaxSum(p, t, h, s, splits);
      const float f = ml[0] == -INFINITY ? 0.0f : expf(ml[0] - mx);
      factor[s] = f;
      sum = fmaf(ml[1], f, sum);
    }
    total = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v = fmaf(PartialAcc(p, t, h, s, splits)[i], factor[s], v);
    out[i] = v / total;
  }
}

template <int kChunks, int kHeads>
cudaError_t LaunchPlan(const SinkAttentionParams& p, const Plan& plan, cudaStream_t stream) {
  auto kernel = SinkAttentionKernel<kChunks, kHeads>;
  const size_t smem = (static_cast<size_t>(kWarps) * kHeads * kChunks * 128 + 2 * kWarps * kHeads +
                       kHeads * kWarps + 2 * kHeads) *
                      sizeof(float);
  static std::once_flag once;
  static cudaError_t attribute = cudaSuccess;
  std::call_once(once, [&] {
    attribute = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  });
  if (attribute != cudaSuccess) return attribute;
  const cudaError_t e = internal::Launch(
      kernel,
      dim3(static_cast<unsigned>(plan.splits), static_cast<unsigned>(plan.groups), static_cast<unsigned>(p.tokens)),
      dim3(kThreads), smem, stream, p, plan.splits, plan.keys_per_split);
  if (e != cudaSuccess || plan.splits == 1) return e;
  return internal::Launch(SinkAttentionMergeKernel,
                          dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.tokens)), dim3(128), 0,
                          stream, p, plan.splits);
}

}  // namespace

int64_t SinkAttentionPartialFloats(int64_t tokens, int heads, int head_dim, int max_keys) {
  const Plan plan = MakePlan(tokens, heads, head_dim, max_keys, INT64_MAX, CurrentDeviceMultiprocessors());
  return plan.splits == 1 ? 0 : tokens * heads * plan.splits * (static_cast<int64_t>(head_dim) + 2);
}

cudaError_t SinkAttention(const SinkAttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (p.q == nullptr || p.keys == nullptr || p.num_keys == nullptr || p.sinks == nullptr || p.out == nullptr ||
      p.tokens < 0 || p.tokens > 65535 || p.heads < 0 || p.head_dim <= 0 || p.head_dim % 4 != 0 ||
      p.head_dim > 1024 || p.max_keys < 0 || p.max_keys > kMaxSinkAttentionKeys || !aligned(p.q) ||
      p.partial_floats < 0 || (p.partial_floats > 0 && p.partials == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const Plan plan = MakePlan(p.tokens, p.heads, p.head_dim, p.max_keys, p.partials == nullptr ? 0 : p.partial_floats,
                             CurrentDeviceMultiprocessors());
  if (plan.groups > 65535) return cudaErrorInvalidValue;
  switch (plan.chunks) {
    case 1:
      return LaunchPlan<1, 4>(p, plan, stream);
    case 2:
      return LaunchPlan<2, 4>(p, plan, stream);
    case 4:
      return LaunchPlan<4, 4>(p, plan, stream);
    default:
      return LaunchPlan<8, 2>(p, plan, stream);
  }
}

}  // namespace tandem::cuda
