// DeepSeek-V4's attention on the GPU: every query head of a token attends
// to one list of keys that are also the values (the sliding window's rows, then the
// compressed entries the indexer chose, or all of them for HCA layers), with a per-head
// "sink" logit that only enlarges the softmax's denominator. The function of
// engine/model/deepseek_v4/v4_math.cc AttendWithSink: out = sum_j p_j key_j in list
// order, p = softmax([q . key_j * scale ..., sink]) without its last entry. Keys are named
// per token by pointer (v4_key_select.h builds the lists), so the window's ring, the
// pass's new rows and the compressed entries of a paged cache are read in place, wherever
// each lives.
//
// Each block serves several heads of one token from one read of each key (V4-Flash's 64
// heads share every key), folding the keys into a running softmax per head; at small
// batches the key list is also split over blocks, whose states a second kernel merges
// with the sink (as split-KV decode attention does). Sums therefore run in another order
// than the CPU's: outputs agree to rounding, not bitwise.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct SinkAttentionParams {
  const float* q = nullptr;  // [tokens][heads][head_dim]
  // [tokens][max_keys] device pointers, each at head_dim floats (16-byte aligned); the
  // first num_keys[t] of a token's row are used.
  const float* const* keys = nullptr;
  const int32_t* num_keys = nullptr;  // [tokens], each in [0, max_keys]
  int max_keys = 0;                   // at most kMaxSinkAttentionKeys
  const float* sinks = nullptr;       // [heads]
  int64_t tokens = 0;
  int heads = 0;
  int head_dim = 0;  // a multiple of 4, at most 1024
  float scale = 1.0f;
  float* out = nullptr;  // [tokens][heads][head_dim]
  // Set to 1 when a token's num_keys is outside [0, max_keys] or one of its used key
  // pointers is null or not 16-byte aligned (its heads' outputs are then zero); may be
  // null.
  int32_t* bad_input = nullptr;
  // Scratch for the key list's splits (SinkAttentionPartialFloats floats); with less (or
  // none) the launch splits less (or not at all).
  float* partials = nullptr;
  int64_t partial_floats = 0;
};

inline constexpr int kMaxSinkAttentionKeys = 8192;

// The scratch a launch of this shape splits its key lists into on the current device
// (0 where it would not split).
int64_t SinkAttentionPartialFloats(int64_t tokens, int heads, int head_dim, int max_keys);

cudaError_t SinkAttention(const SinkAttentionParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
