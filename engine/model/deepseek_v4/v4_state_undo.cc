#include "engine/model/deepseek_v4/v4_state_undo.h"

#include <cstring>

#include "kernels/common/check.h"

namespace tandem::v4 {

AppendUndo RecordAppend(const CompressorState& s) {
  AppendUndo u;
  const auto row = [&](const std::vector<float>& v) {
    const auto first = v.begin() + s.partial_tokens * s.proj_width;
    return std::vector<float>(first, first + s.proj_width);
  };
  u.kv = row(s.partial_kv);
  u.gate = row(s.partial_gate);
  u.had_overlap = s.has_overlap;
  // Only a closing Append (the window's last row) replaces the overlap half.
  if (s.partial_tokens == s.rate - 1 && !s.overlap_kv.empty()) {
    u.overlap_kv = s.overlap_kv;
    u.overlap_gate = s.overlap_gate;
  }
  return u;
}

void NoteAppended(const CompressorState& s, AppendUndo* undo) { undo->closed = s.partial_tokens == 0; }

namespace {

// Undoes the Append of `position` on `s`.
void UndoAppend(const AppendUndo& u, int64_t position, CompressorState& s) {
  if (u.closed) {
    TANDEM_CHECK_GE(s.num_entries, 1);
    --s.num_entries;
    s.entries.resize(static_cast<size_t>(s.num_entries * s.width));
    if (!u.overlap_kv.empty()) {
      s.overlap_kv = u.overlap_kv;
      s.overlap_gate = u.overlap_gate;
    }
    s.has_overlap = u.had_overlap;
  }
  s.partial_tokens = position % s.rate;
  TANDEM_CHECK_EQ(s.num_entries, position / s.rate);
  std::memcpy(&s.partial_kv[s.partial_tokens * s.proj_width], u.kv.data(), u.kv.size() * sizeof(float));
  std::memcpy(&s.partial_gate[s.partial_tokens * s.proj_width], u.gate.data(), u.gate.size() * sizeof(float));
}

}  // namespace

void TakeBack(const StateUndo& undo, int64_t to, int64_t sliding_window, SequenceState& state) {
  TANDEM_CHECK_GE(undo.from, 0) << "nothing was recorded";
  TANDEM_CHECK(undo.from <= to && to <= undo.end) << "take back to " << to << " outside [" << undo.from << ", "
                                                   << undo.end << "]";
  TANDEM_CHECK_EQ(state.num_tokens, undo.end);
  TANDEM_CHECK_EQ(undo.layers.size(), state.layers.size());
  for (size_t l = 0; l < undo.layers.size(); ++l) {
    const LayerUndo& lu = undo.layers[l];
    LayerState& ls = state.layers[l];
    const int64_t width = static_cast<int64_t>(ls.window.size()) / sliding_window;
    for (int64_t p = undo.end - 1; p >= to; --p) {
      const size_t i = static_cast<size_t>(p - undo.from);
      std::memcpy(&ls.window[(p % sliding_window) * width], &lu.ring[i * width], width * sizeof(float));
      if (ls.compressor) UndoAppend(lu.compressor.at(i), p, *ls.compressor);
      if (ls.indexer) UndoAppend(lu.indexer.at(i), p, *ls.indexer);
    }
  }
  state.num_tokens = to;
}

}  // namespace tandem::v4
