// What the incremental DeepSeek-V4 forward pass carries between calls for one sequence,
// as plain per-layer streams a paged cache can map one to one (shared/models/deepseek-v4.md
// §3.1; transformers keeps the same state in DeepseekV4HCACache / DeepseekV4CSACache):
//   - a ring of the last sliding_window K=V vectors (per token, [head_dim]),
//   - per CSA/HCA layer the compressed entries (one per window of compress_rate tokens,
//     [head_dim], normalized and rotated at the window's first position),
//   - per CSA layer the indexer's keys (one per window, [index_head_dim]),
//   - per compressor the unfinished window (projected kv and gate rows of its tokens,
//     position bias not yet added) and, for CSA's overlapping windows, the previous
//     complete window's first half (Ca kv and gate, position bias added).
// Every position-dependent value is applied when it is written (RoPE at absolute
// positions), so the state is exact wherever it moves as long as num_tokens travels too.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tandem::v4 {

// One compressor's streams (a CSA or HCA layer's main compressor at head_dim, or a CSA
// layer's indexer at index_head_dim).
struct CompressorState {
  int64_t width = 0;       // entry width
  int64_t proj_width = 0;  // 2 * width with overlapping windows (CSA, indexer), else width
  int64_t rate = 0;        // tokens per window

  // Per window, in window order: [num_entries][width].
  int64_t num_entries = 0;
  std::vector<float> entries;

  // The unfinished window: [partial_tokens][proj_width] each, at most rate - 1 rows.
  int64_t partial_tokens = 0;
  std::vector<float> partial_kv;
  std::vector<float> partial_gate;

  // Overlapping windows only: the last complete window's Ca half, [rate][width] each;
  // absent until a window has closed (window 0 has no predecessor).
  bool has_overlap = false;
  std::vector<float> overlap_kv;
  std::vector<float> overlap_gate;
};

struct LayerState {
  // K=V of position p in slot p % sliding_window: [sliding_window][head_dim]. Slots of
  // positions older than the window are stale, never read.
  std::vector<float> window;
  std::optional<CompressorState> compressor;  // CSA and HCA layers
  std::optional<CompressorState> indexer;     // CSA layers
};

struct SequenceState {
  int64_t num_tokens = 0;  // positions processed; the next token's position
  std::vector<LayerState> layers;
};

}  // namespace tandem::v4
