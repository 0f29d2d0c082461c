// DeepSeek-V4's key lists on the GPU: for each query token of a pass, the pointers to the
// keys (= values) it attends to, in the order of the CPU engine's RunAttention
// (engine/model/deepseek_v4/v4_attention.cc): the sliding window's keys by position, then
// the compressed entries it sees: every visible one (HCA) or the indexer's top k of them
// in ascending entry order (CSA). sink_attention.h consumes the lists.
//
// A window key at position j is the pass's new row when j >= the sequence's first new
// position, else the sequence's ring (row j % window). Entry e of a sequence is visible to
// position pos when e < (pos + 1) / rate and the entry exists after this pass.
//
// CSA scoring is the CPU's expression: score_e = sum over heads h, ascending, of
// (max(q_h . k_e, 0) * key_scale) * (w_h * head_scale), key_scale = 1/sqrt(index_head_dim),
// head_scale = 1/sqrt(index_heads), each rounded to float from double as the CPU does;
// the dot products sum in another order than cpu::Dot's (last bits). The choice is
// v4::TopK's: the k largest, ties to the lower index, found by a radix select on the
// scores' bits (linear in the visible count, whatever k).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

enum V4KeySelectType : int { kV4KeysSliding = 0, kV4KeysCompressedSparse = 1, kV4KeysHeavilyCompressed = 2 };

struct V4KeySelectParams {
  int64_t tokens = 0;
  const int32_t* token_seq = nullptr;  // [tokens]: the token's sequence (index into the per-sequence arrays)
  const int32_t* token_pos = nullptr;  // [tokens]: absolute position, >= its sequence's seq_start
  // Per sequence (device arrays [num_sequences]):
  const int32_t* seq_start = nullptr;  // position of the sequence's first new row in this pass
  const int32_t* seq_row0 = nullptr;   // row of that first new row in chunk_kv
  // This layer's sliding-window ring of each sequence: [window][head_dim], position j in
  // row j % window (a null ring is an error only where a token needs it).
  const float* const* seq_ring = nullptr;
  const int32_t* seq_entries = nullptr;      // compressed entries the sequence has after this pass
  const int64_t* seq_entry_begin = nullptr;  // index into entry_rows of the sequence's entry 0
  const float* chunk_kv = nullptr;           // [rows][chunk_kv_stride]: the pass's new K=V rows
  int64_t chunk_kv_stride = 0;
  int window = 0;    // >= 1
  int head_dim = 0;  // >= 1
  int type = kV4KeysSliding;
  int rate = 0;  // tokens per compressed window (CSA or HCA), >= 1 there
  // Entry e of sequence s is row entry_rows[seq_entry_begin[s] + e] of `entries` (and of
  // `index_keys`).
  const int64_t* entry_rows = nullptr;
  const float* entries = nullptr;     // [rows][head_dim]: this layer's compressed entries
  const float* index_keys = nullptr;  // CSA: [rows][index_head_dim]
  const float* index_q = nullptr;     // CSA: [tokens][index_heads][index_head_dim] (roped)
  const float* index_w = nullptr;     // CSA: [tokens][index_heads]
  int index_heads = 0;                // CSA: 1..64
  int index_head_dim = 0;             // CSA: 1..128
  int topk = 0;                       // CSA: >= 1
  float* scores = nullptr;            // CSA scratch: [tokens][max_entries]
  int64_t max_entries = 0;            // CSA: >= every token's visible count (bad_input otherwise)
  const float** keys = nullptr;       // out: [tokens][max_keys]
  int32_t* num_keys = nullptr;        // out: [tokens]
  int max_keys = 0;                   // >= every token's list (bad_input otherwise)
  // May be null: set to 1 when a token's list would not fit max_keys, its visible count
  // exceeds max_entries (CSA), its position is negative, or it needs a null ring; that
  // token's num_keys is then 0.
  int32_t* bad_input = nullptr;
};

cudaError_t V4KeySelect(const V4KeySelectParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
