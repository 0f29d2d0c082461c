// Paged multi-head latent attention for decode, absorbed form (docs/design.md §8): every query
// head attends directly over the cached latent entries (kv_lora_rank normalized latent
// values, then qk_rope_head_dim rotated rotary key), so the cache is read once per
// sequence for all heads. The caller has already folded kv_b's key half into the query
// (q_latent = q_nope · W_UK per head) and applies kv_b's value half to the output.
//
//   score[h][p] = softmax_scale * (q[h][0:R+P] · entry[p][0:R+P])   R = kv_lora_rank, P = rope
//   out[h]      = sum_p softmax(score[h])[p] * entry[p][0:R]
//
// Several query tokens per sequence (q_per_seq, e.g. for speculative decoding): query
// token t of sequence s sits at position cache_lens[s] - q_per_seq + t and attends to
// positions [0, cache_lens[s] - q_per_seq + t]. Long contexts are split across thread
// blocks (split-KV) and combined with their log-sum-exp; the workspace holds the
// partial results. No allocation inside: CUDA-graph safe (the grid is sized from
// max_cache_len; each sequence's splits share its actual length).
//
// Two kernels: a portable one (mma.sync m16n8k16 tensor cores, 16 or 32 query rows
// (heads x q_per_seq) per thread block; all dimensions, sm_90a and sm_100a) and, on sm_90
// for kv_lora_rank 512 + rope 64, a wgmma one (64 query rows per thread block, padded when
// fewer). Each KV tile of 64 positions is loaded once into shared memory (double-buffered)
// and serves as keys (all R+P columns) and values (first R).
// Pointers q and kv_cache must be 16-byte aligned and q_stride a multiple of 8; out must
// be 8-byte aligned with an even out_stride; the workspace 16-byte aligned. Every kernel
// here supports programmatic dependent launch (launch_control.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct MlaDecodeParams {
  // [num_seqs * q_per_seq][num_heads][kv_lora_rank + rope_dim], row stride q_stride
  // elements between query tokens (heads contiguous inside a token).
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0;
  // Optional, same layout: each query value's bf16 remainder (q + q_lo ~ the float32 query).
  // Honoured by the portable kernel (MlaDecodeSplitsQueries): each tile holds half its rows'
  // queries, each query's value and remainder in two rows that one thread's accumulators
  // cover, so the score is the float32-accurate query's; the probabilities are split the
  // same way for the product with the values. Twice the row tiles, so meant for sequences
  // of few query rows (the kernel is memory-bound there). Ignored by the wgmma kernel.
  const __nv_bfloat16* q_lo = nullptr;
  // One layer of the paged cache: [num_blocks][block_size][kv_lora_rank + rope_dim].
  const __nv_bfloat16* kv_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  const int32_t* cache_lens = nullptr;    // [num_seqs], each >= q_per_seq
  // Position p of a sequence is the cache entry of slot p + kv_offset of its block table
  // (the MTP layer's cache: slot q holds position q - 1, docs/speculative-decoding.md).
  int kv_offset = 0;
  int num_seqs = 0;
  int q_per_seq = 1;
  int num_heads = 0;
  int kv_lora_rank = 0;  // multiple of 32, at most 512
  int rope_dim = 0;      // multiple of 16, at most 64
  int block_size = 64;
  int max_blocks_per_seq = 0;
  int max_cache_len = 0;  // an upper bound of cache_lens (sizes the split-KV grid)
  float softmax_scale = 1.0f;
  // [num_seqs * q_per_seq][num_heads][kv_lora_rank] float32, row stride out_stride
  // elements between query tokens.
  float* out = nullptr;
  int64_t out_stride = 0;
  // Split-KV scratch, at least MlaDecodeWorkspaceBytes(...) bytes.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Overrides for tests and benchmarks; 0 = automatic. num_splits: KV splits per sequence
  // (1 = no split; at most 128 and the 64-position tiles of max_cache_len; the workspace
  // must then hold MlaDecodeWorkspaceBytesForSplits(...)).
  // impl: 1 = portable mma.sync kernel, 2 = sm_90a wgmma kernel (rejected where unsupported).
  int num_splits = 0;
  int impl = 0;
  // The same kernel and tile shape whatever q_per_seq and num_heads (the portable kernel's
  // two-tile rows otherwise depend on them), so that a query's arithmetic does not depend
  // on its launch: with num_splits 1, the batch-invariant mode.
  bool fixed_plan = false;
  // Optional: the absorbed form's value projection fused into the split combine, for
  // launches of at most kMlaDecodeFusedMaxTokens query tokens (decode steps of a few
  // sequences): out_v[token][h][0:v_dim] = W_UV[h] . latent_out[token][h] in float32, with
  // W_UV[h] = w_uv + h * w_uv_head_stride: [v_dim][kv_lora_rank] bf16 (kv_b's value rows of
  // head h). `out` is then scratch (written when there is one split). v_dim even.
  const __nv_bfloat16* w_uv = nullptr;
  int64_t w_uv_head_stride = 0;
  int v_dim = 0;
  float* out_v = nullptr;  // [tokens][out_v_stride]: head h at h * v_dim
  int64_t out_v_stride = 0;
};

inline constexpr int kMlaDecodeFusedMaxTokens = 16;

// Workspace bytes for the largest launch of these dimensions on the current device (any
// max_cache_len up to this one); 0 when no launch of them splits.
size_t MlaDecodeWorkspaceBytes(int num_seqs, int q_per_seq, int num_heads, int kv_lora_rank, int max_cache_len);
// Workspace bytes for a launch forced to num_splits splits (MlaDecodeParams::num_splits).
size_t MlaDecodeWorkspaceBytesForSplits(int num_seqs, int q_per_seq, int num_heads, int kv_lora_rank, int num_splits);

// Whether the kernel MlaDecodeAttention picks for these dimensions on the current device
// (impl 0) honours MlaDecodeParams::q_lo: everywhere but kv_lora_rank 512 + rope 64 on sm_90.
bool MlaDecodeSplitsQueries(int kv_lora_rank, int rope_dim);

cudaError_t MlaDecodeAttention(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
