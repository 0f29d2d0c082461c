// One DeepSeek-V4 decoder layer's attention over a chunk of consecutive tokens of one
// sequence (shared/models/deepseek-v4.md §2.5-2.8): the shared K=V head with the
// weightless per-head query norm, the sliding window with per-head sinks, for CSA layers
// the compressor over overlapping windows and the lightning indexer's top-k, for HCA
// layers the compressor over disjoint windows, and the grouped low-rank output
// projection with the rope dimensions rotated back.
//
// Two forms. Full: the chunk is the whole sequence from position 0 and nothing is
// carried; every compressed entry is pooled from the chunk's own projections
// (transformers without a cache). Incremental: the chunk continues `state` (its window
// ring, compressed entries, indexer keys, unfinished windows) and leaves it updated.
// Both run the same arithmetic in the same order, so their outputs agree bitwise.
#pragma once

#include <cstdint>

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_math.h"
#include "engine/model/deepseek_v4/v4_state.h"
#include "engine/model/deepseek_v4/v4_state_undo.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::v4 {

struct AttentionParams {
  const DeepseekV4Config* config = nullptr;
  const AttentionWeights* weights = nullptr;
  AttentionType type = AttentionType::kSliding;
  const Rope* rope = nullptr;           // the layer's table: main (sliding) or compress
  const Rope* compress_rope = nullptr;  // compressed entries and the indexer
  const float* x = nullptr;             // [rows][hidden_size]: input_layernorm(collapsed streams)
  int64_t rows = 0;
  int64_t start_position = 0;   // must be 0 in the full form
  LayerState* state = nullptr;  // null: the full form
  float* out = nullptr;         // [rows][hidden_size]
  // Incremental form: what positions from undo_from on overwrite in the state is appended
  // here (v4_state_undo.h); the chunk must then be at most sliding_window tokens.
  LayerUndo* undo = nullptr;
  int64_t undo_from = 0;
  // The FP8 projections' inputs rounded as the GPU's FP8 GEMM reads them
  // (cpu::MatmulParams::round_fp8_input): the CPU reference for the GPU's FP8 prefill.
  bool round_fp8_input = false;
};

void RunAttention(const AttentionParams& p, cpu::ThreadPool& pool);

// A fresh state of one layer (empty window, no entries).
LayerState NewLayerState(const DeepseekV4Config& c, AttentionType type);

}  // namespace tandem::v4
