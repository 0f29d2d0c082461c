#include "kernels/cuda/v4_key_select.h"

#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kScoreEntries = 64;  // entries scored per block: 8 per warp
constexpr int kMaxIndexHeads = 64;
constexpr int kMaxIndexHeadDim = 128;  // 4 values per lane

// What the select kernel needs of a token, computed alike by both kernels.
struct TokenPlan {
  int seq;
  int pos;
  int first;    // first window position
  int window;   // window keys
  int visible;  // compressed entries it sees
  int chosen;   // compressed entries it attends to
  bool bad;
};

__device__ TokenPlan Plan(const V4KeySelectParams& p, int64_t t) {
  TokenPlan k;
  k.seq = p.token_seq[t];
  k.pos = p.token_pos[t];
  k.first = max(0, k.pos - p.window + 1);
  k.window = k.pos - k.first + 1;
  k.visible = 0;
  if (p.type != kV4KeysSliding) k.visible = max(0, min((k.pos + 1) / p.rate, p.seq_entries[k.seq]));
  k.chosen = p.type == kV4KeysCompressedSparse ? min(p.topk, k.visible) : k.visible;
  k.bad = k.pos < 0 || static_cast<int64_t>(k.window) + k.chosen > p.max_keys ||
          (p.type == kV4KeysCompressedSparse && k.visible > p.max_entries) ||
          (k.first < p.seq_start[k.seq] && p.seq_ring[k.seq] == nullptr);
  return k;
}

// Grid (tokens, entry blocks), CSA only: the indexer's score of every visible entry into
// scores[t][e]. A warp per entry, its key in registers; the heads summed in order by
// every lane alike. Shared: the token's queries [heads][dim], then the scaled head weights.
__global__ void ScoreKernel(V4KeySelectParams p, float key_scale, float head_scale) {
  extern __shared__ float smem[];
  internal::WaitAndTrigger();
  const int64_t t = blockIdx.x;
  const TokenPlan plan = Plan(p, t);
  const int64_t e0 = static_cast<int64_t>(blockIdx.y) * kScoreEntries;
  const int64_t visible = plan.visible;  // at most max_entries unless bad
  if (plan.bad || plan.chosen == plan.visible || e0 >= visible) return;  // no selection to make
  const int ni = p.index_heads, ci = p.index_head_dim;
  float* q = smem;
  float* w = smem + ni * ci;
  const float* tq = p.index_q + t * ni * ci;
  for (int i = threadIdx.x; i < ni * ci; i += kThreads) q[i] = tq[i];
  for (int h = threadIdx.x; h < ni; h += kThreads) w[h] = __fmul_rn(p.index_w[t * ni + h], head_scale);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t* rows = p.entry_rows + p.seq_entry_begin[plan.seq];
  float* scores = p.scores + t * p.max_entries;
  const int64_t e1 = e0 + kScoreEntries < visible ? e0 + kScoreEntries : visible;
  for (int64_t e = e0 + warp; e < e1; e += kWarps) {
    const float* key = p.index_keys + rows[e] * ci;
    float k[kMaxIndexHeadDim / 32];
#pragma unroll
    for (int j = 0; j < kMaxIndexHeadDim / 32; ++j) k[j] = lane + 32 * j < ci ? key[lane + 32 * j] : 0.0f;
    float score = 0.0f;
    for (int h = 0; h < ni; ++h) {
      const float* qh = q + h * ci;
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxIndexHeadDim / 32; ++j) {
        if (lane + 32 * j < ci) dot = fmaf(qh[lane + 32 * j], k[j], dot);
      }
      dot = internal::WarpSum(dot);
      // The CPU's score += (max(dot, 0) * key_scale) * (w * head_scale), which GCC
      // contracts into one fma of the two rounded products (x86-64-v3, seen in
      // v4_attention.cc.o's disassembly).
      score = fmaf(__fmul_rn(fmaxf(dot, 0.0f), key_scale), w[h], score);
    }
    if (lane == 0) scores[e] = score;
  }
}

// Order-preserving unsigned key of a float (larger float, larger key); -0 as +0 so that
// the two zeros tie as they compare on the CPU.
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Block-wide exclusive prefix of `flag` in thread order plus the block's total, through
// `counts` (kWarps ints). Contains one __syncthreads, so two calls on different `counts`
// may alternate without more (a call's writes wait for every thread to pass the other's).
__device__ __forceinline__ int BlockPrefix(bool flag, int* counts, int* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) counts[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), all = 0;
  for (int i = 0; i < kWarps; ++i) {
    if (i < warp) before += counts[i];
    all += counts[i];
  }
  *total = all;
  return before;
}

// One block per token: the window's pointers, then the compressed ones.
__global__ void SelectKernel(V4KeySelectParams p) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_equal;
  __shared__ int eq_counts[kWarps], sel_counts[kWarps];
  internal::WaitAndTrigger();
  const int64_t t = blockIdx.x;
  const TokenPlan plan = Plan(p, t);
  if (plan.bad) {
    if (threadIdx.x == 0) {
      p.num_keys[t] = 0;
      if (p.bad_input != nullptr) atomicExch(p.bad_input, 1);
    }
    return;
  }
  const float** keys = p.keys + t * p.max_keys;
  const int start = p.seq_start[plan.seq];
  const float* ring = p.seq_ring[plan.seq];
  const int64_t row0 = p.seq_row0[plan.seq];
  for (int i = threadIdx.x; i < plan.window; i += kThreads) {
    const int j = plan.first + i;
    keys[i] = j >= start ? p.chunk_kv + (row0 + j - start) * p.chunk_kv_stride
                         : ring + static_cast<int64_t>(j % p.window) * p.head_dim;
  }
  if (threadIdx.x == 0) p.num_keys[t] = plan.window + plan.chosen;
  if (plan.chosen == 0) return;
  const int64_t* rows = p.entry_rows + p.seq_entry_begin[plan.seq];
  const float** out = keys + plan.window;
  if (plan.chosen == plan.visible) {  // HCA, or CSA with no more entries than k
    for (int e = threadIdx.x; e < plan.visible; e += kThreads) out[e] = p.entries + rows[e] * p.head_dim;
    return;
  }
  // The chosen-th largest key by radix select, a byte at a time from the top: among the
  // scores matching the prefix found so far, the byte holding the `remaining`-th largest.
  const float* scores = p.scores + t * p.max_entries;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_equal = plan.chosen;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for (int e = threadIdx.x; e < plan.visible; e += kThreads) {
      const uint32_t key = OrderKey(scores[e]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int remaining = s_equal;
      for (int b = 255; b >= 0; --b) {
        if (static_cast<int>(hist[b]) >= remaining) {
          s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
          s_mask = mask | (0xffu << shift);
          s_equal = remaining;
          break;
        }
        remaining -= static_cast<int>(hist[b]);
      }
    }
    __syncthreads();
  }
  // Every score above the threshold and the first s_equal equal to it (ties to the lower
  // index), compacted in entry order.
  const uint32_t threshold = s_prefix;
  const int take_equal = s_equal;
  int equal_before = 0, written = 0;
  for (int base = 0; base < plan.visible && written < plan.chosen; base += kThreads) {
    const int e = base + threadIdx.x;
    const uint32_t key = e < plan.visible ? OrderKey(scores[e]) : 0u;
    const bool valid = e < plan.visible;
    int equal_total, chosen_total;
    const int rank = equal_before + BlockPrefix(valid && key == threshold, eq_counts, &equal_total);
    const bool chosen = valid && (key > threshold || (key == threshold && rank < take_equal));
    const int at = written + BlockPrefix(chosen, sel_counts, &chosen_total);
    if (chosen) out[at] = p.entries + rows[e] * p.head_dim;
    equal_before += equal_total;
    written += chosen_total;
  }
}

}  // namespace

cudaError_t V4KeySelect(const V4KeySelectParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  const bool csa = p.type == kV4KeysCompressedSparse;
  if (p.tokens < 0 || p.tokens > 0x7fffffff || p.token_seq == nullptr || p.token_pos == nullptr ||
      p.seq_start == nullptr || p.seq_row0 == nullptr || p.seq_ring == nullptr || p.chunk_kv == nullptr ||
      p.chunk_kv_stride < p.head_dim || p.window < 1 || p.head_dim < 1 || p.keys == nullptr ||
      p.num_keys == nullptr || p.max_keys < 0 ||
      (p.type != kV4KeysSliding && p.type != kV4KeysCompressedSparse && p.type != kV4KeysHeavilyCompressed)) {
    return cudaErrorInvalidValue;
  }
  if (p.type != kV4KeysSliding &&
      (p.rate < 1 || p.seq_entries == nullptr || p.seq_entry_begin == nullptr || p.entry_rows == nullptr ||
       p.entries == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (csa && (p.index_keys == nullptr || p.index_q == nullptr || p.index_w == nullptr || p.scores == nullptr ||
              p.index_heads < 1 || p.index_heads > kMaxIndexHeads || p.index_head_dim < 1 ||
              p.index_head_dim > kMaxIndexHeadDim || p.topk < 1 || p.max_entries < 0 ||
              (p.max_entries + kScoreEntries - 1) / kScoreEntries > 65535)) {
    return cudaErrorInvalidValue;
  }
  if (csa && p.max_entries > 0) {
    // The CPU's scales: float(1 / sqrt(double)).
    const float key_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.index_head_dim)));
    const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.index_heads)));
    const size_t smem = static_cast<size_t>(p.index_heads) * (p.index_head_dim + 1) * sizeof(float);
    const cudaError_t e = internal::Launch(
        ScoreKernel,
        dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>((p.max_entries + kScoreEntries - 1) / kScoreEntries)),
        dim3(kThreads), smem, stream, p, key_scale, head_scale);
    if (e != cudaSuccess) return e;
  }
  return internal::Launch(SelectKernel, dim3(static_cast<unsigned>(p.tokens)), dim3(kThreads), 0, stream, p);
}

}  // namespace tandem::cuda
