// Taking a DeepSeek-V4 sequence's state (v4_state.h) back over its last positions: what
// speculative decoding needs when the target step verified drafts and some were refused
// (docs/speculative-decoding.md). A V2/V3 sequence's KV is one entry per position, so a
// refused draft's entry is simply overwritten later; V4's state is not: the sliding
// window is a ring (a draft's row replaces the row of the position W before it, which the
// next step still reads), and a compressor's unfinished window is overwritten and reset
// when a window closes. So the forward pass records, for the positions that may be taken
// back, what each one overwrote, and TakeBack restores it newest first: the result is
// bitwise the state a forward pass over the kept positions alone leaves.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/deepseek_v4/v4_state.h"

namespace tandem::v4 {

// What one compressor Append at one position overwrote.
struct AppendUndo {
  std::vector<float> kv, gate;  // the unfinished window's row it wrote (proj_width each)
  bool closed = false;          // it closed a window (an entry was added)
  bool had_overlap = false;     // before the close
  std::vector<float> overlap_kv, overlap_gate;  // before the close (overlapping windows)
};

struct LayerUndo {
  std::vector<float> ring;  // the window rows positions [from, end) overwrote, in position order
  std::vector<AppendUndo> compressor, indexer;  // one per position, in order (CSA/HCA; CSA)
};

struct StateUndo {
  int64_t from = -1;  // the first position that may be taken back; -1: nothing recorded
  int64_t end = 0;    // the state's num_tokens after the recorded pass
  std::vector<LayerUndo> layers;
};

// Before compressor `s` appends position `position`'s row (unfinished-window row
// position % rate): what the Append will overwrite.
AppendUndo RecordAppend(const CompressorState& s);
// After that Append: whether it closed a window (from the state it left).
void NoteAppended(const CompressorState& s, AppendUndo* undo);

// Takes `state` (the state `undo` was recorded into, at num_tokens == undo.end) back to
// num_tokens == to, for undo.from <= to <= undo.end. Checked.
void TakeBack(const StateUndo& undo, int64_t to, int64_t sliding_window, SequenceState& state);

}  // namespace tandem::v4
