// Causal attention of one sequence's prefill chunk in the expanded MLA form (docs/design.md
// §8): the cached latents of positions [0, num_kv) have been projected by kv_b into
// per-head keys (nope part) and values; the rotary key part is shared by all heads.
// Query i sits at position num_kv - num_q + i and attends to keys [0, num_kv - num_q + i],
// so a chunk after a cached prefix (num_kv > num_q) works like a first chunk. Long
// prompts run tile by tile (flash-attention style, online softmax), never materializing
// the [num_q][num_kv] score matrix. No allocation inside.
//
// Portable kernel: one thread block per (64 queries, head); four warps of 16 query rows
// each, mma.sync m16n8k16 tensor cores (bf16 in, fp32 accumulate), K and V tiles of 64
// keys double-buffered in shared memory by cp.async. On sm_90 for the DeepSeek widths
// (nope 128, rope 64, v 128): a wgmma kernel, 128 queries per thread block (two
// warpgroups sharing the K and V tiles). The probabilities are rounded to bf16 for the
// P·V product. All pointers must be 16-byte aligned and all strides multiples of 8
// elements (out: 8-byte aligned, even stride).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct MlaPrefillParams {
  const __nv_bfloat16* q = nullptr;       // [num_q][num_heads][nope_dim + rope_dim], row stride q_stride
  const __nv_bfloat16* k_nope = nullptr;  // [num_kv][num_heads][nope_dim], row stride k_nope_stride
  const __nv_bfloat16* k_rope = nullptr;  // [num_kv][rope_dim], row stride k_rope_stride
  const __nv_bfloat16* v = nullptr;       // [num_kv][num_heads][v_dim], row stride v_stride
  int64_t q_stride = 0, k_nope_stride = 0, k_rope_stride = 0, v_stride = 0;
  // Elements between heads inside a k_nope / v row; 0 = dense (nope_dim / v_dim). Lets the
  // kv_b projection's [num_kv][num_heads][nope_dim + v_dim] output be passed as it is:
  // k_nope = kv, v = kv + nope_dim, both strides num_heads * (nope_dim + v_dim), both head
  // strides nope_dim + v_dim.
  int64_t k_nope_head_stride = 0, v_head_stride = 0;
  int num_q = 0;
  int num_kv = 0;  // >= num_q
  int num_heads = 0;
  int nope_dim = 0;  // multiple of 16, at most 192
  int rope_dim = 0;  // multiple of 16, at most 64
  int v_dim = 0;     // multiple of 16, at most 192
  float softmax_scale = 1.0f;
  float* out = nullptr;  // [num_q][num_heads][v_dim] float32, row stride out_stride
  int64_t out_stride = 0;
  // Kernel override for tests and benchmarks: 0 = automatic, 1 = portable mma.sync kernel,
  // 2 = sm_90a wgmma kernel (DeepSeek widths only; rejected elsewhere).
  int impl = 0;
};

cudaError_t MlaPrefillAttention(const MlaPrefillParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
