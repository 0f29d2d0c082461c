// What one GPU forward pass of DeepSeek-V4 (cuda_v4_model.h) reads and writes where,
// worked out on the host before anything is launched: every address of a sequence's
// state (its sliding-window ring, its compressors' unfinished windows and overlap
// halves, its compressed entries in the paged blocks) follows from its start position,
// its new tokens, its block table and its state slot, which the host knows. So the
// compressor's state machine (v4_attention.cc Compressor::Append) becomes lists of row
// pointers: which rows pool into which new entry, which rows move into the state, which
// K=V rows enter the ring. The GPU then runs a few gather kernels per layer with no
// host round trip; only the indexer's choice of entries is made on the device.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/deepseek_v4/cuda/cuda_v4_weights.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/forward_batch.h"
#include "engine/model/kv_pool.h"
#include "kernels/cuda/v4_compressor.h"

namespace tandem::v4::cuda_v4 {

// dst[i] = src[i] (+ bias[i]) over one launch's width.
struct RowCopy {
  const float* src = nullptr;
  const float* bias = nullptr;
  float* dst = nullptr;
};

// One compressor of one layer (a CSA or HCA layer's main one, or a CSA layer's indexer).
struct CompressorJob {
  int max_slots = 0;
  std::vector<cuda::CompressorSlot> slots;  // [windows][max_slots]
  std::vector<int32_t> num_slots;           // [windows]
  std::vector<int32_t> positions;           // [windows]: window index x rate
  std::vector<float*> out;                  // [windows]: the entries' places in the pool
  std::vector<RowCopy> overlap_copies;      // entry width: the last closed window's first half
  std::vector<RowCopy> partial_copies;      // projection width: the unfinished window's new rows
  int64_t windows() const { return static_cast<int64_t>(num_slots.size()); }
};

struct LayerPlan {
  CompressorJob main, indexer;
  std::vector<RowCopy> ring_copies;  // head_dim wide, after the layer's attention
  std::vector<const float*> seq_ring;  // [sequences]: the ring of this layer
  const float* entries = nullptr;      // the layer's compressed entries (row r at r x head_dim)
  const float* index_keys = nullptr;   // CSA: the indexer's keys (row r at r x index_head_dim)
};

struct StepPlan {
  int64_t rows = 0;
  std::vector<int32_t> tokens, positions, token_seq;  // [rows]
  std::vector<int32_t> seq_start, seq_row0;           // [sequences]
  // Compressed entries each sequence has after the pass, and where entry e lives: row
  // entry_rows[seq_entry_begin[s] + e] of its layer's region (CSA entries and indexer keys
  // share a numbering; HCA has its own rate and hence its own).
  std::vector<int32_t> seq_entries_csa, seq_entries_hca;
  std::vector<int64_t> seq_entry_begin_csa, seq_entry_begin_hca, entry_rows_csa, entry_rows_hca;
  int64_t max_entries_csa = 0, max_entries_hca = 0;
  std::vector<int32_t> logits_rows;  // the batch rows that get logits, in batch order
  std::vector<LayerPlan> layers;
};

// Where the pass's per-row projections are, for the pointers the plan holds: the input
// projections' output [rows][x_stride of the layer] and the normalized, rotated K=V rows
// [rows][head_dim].
struct PlanBuffers {
  const float* x_proj = nullptr;
  const float* kv = nullptr;
};

// `pool` is the GPU pool (its addresses are device addresses; nothing is dereferenced).
// The batch must have been checked (tokens, positions, block tables, slots).
StepPlan BuildStepPlan(const DeepseekV4Config& c, const CudaV4Weights& w, std::span<const ForwardSequence> batch,
                       KvPool& pool, const PlanBuffers& buffers);

}  // namespace tandem::v4::cuda_v4
