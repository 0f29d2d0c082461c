// KvPool::SequenceExtents: the byte ranges a sequence's KV occupies, in the order both
// ends of a transfer walk them (kv_pool.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/model/kv_pool.h"

namespace tandem {

absl::StatusOr<std::vector<KvExtent>> KvPool::SequenceExtents(const std::vector<KvStream>& streams, const Geometry& g,
                                                              std::span<const int32_t> block_table, int64_t slot,
                                                              int64_t num_tokens) {
  size_t total = 0;
  absl::StatusOr<std::vector<StreamPlace>> plan = Plan(streams, g, &total);
  if (!plan.ok()) return plan.status();
  if (num_tokens <= 0) return absl::InvalidArgumentError(absl::StrCat("num_tokens: ", num_tokens));
  const int64_t bs = g.block_size;
  if (num_tokens > static_cast<int64_t>(block_table.size()) * bs) {
    return absl::InvalidArgumentError(absl::StrCat("block table: ", block_table.size(), " blocks for ", num_tokens,
                                                   " tokens"));
  }
  const int64_t blocks_needed = (num_tokens + bs - 1) / bs;
  if (static_cast<int64_t>(block_table.size()) < blocks_needed) {
    return absl::InvalidArgumentError(absl::StrCat("block table: ", block_table.size(), " blocks for ", num_tokens,
                                                   " tokens, which need ", blocks_needed));
  }
  for (int64_t k = 0; k < blocks_needed; ++k) {
    const int32_t b = block_table[static_cast<size_t>(k)];
    if (b < 0 || b >= g.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block table: block ", b, " outside the pool's ", g.num_blocks));
    }
  }
  const bool has_rows = std::any_of(streams.begin(), streams.end(), [](const KvStream& s) { return !IsPaged(s); });
  if (has_rows && (slot < 0 || slot >= g.num_sequence_slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence slot ", slot, " outside the pool's ", g.num_sequence_slots));
  }
  std::vector<KvExtent> out;
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    for (size_t si = 0; si < streams.size(); ++si) {
      const KvStream& s = streams[si];
      const StreamPlace& p = (*plan)[si];
      const int32_t li = p.layer_index[static_cast<size_t>(layer)];
      if (li < 0) continue;
      if (!IsPaged(s)) {
        const size_t rows = static_cast<size_t>(s.tokens) * p.entry_bytes;
        out.push_back({layer, p.offset + (static_cast<size_t>(slot) * s.layers.size() + li) * rows, rows});
        continue;
      }
      const size_t page = static_cast<size_t>(p.entries_per_block) * p.entry_bytes;
      auto page_offset = [&](int64_t k) {
        return p.offset + (static_cast<size_t>(li) * g.num_blocks + block_table[static_cast<size_t>(k)]) * page;
      };
      if (s.granularity == KvGranularity::kPerToken) {
        for (int64_t k = 0; k < blocks_needed; ++k) {
          const int64_t n = std::min(bs, num_tokens - k * bs);
          out.push_back({layer, page_offset(k), static_cast<size_t>(n) * p.entry_bytes});
        }
        continue;
      }
      // Per window: the closed windows' entries, each in the block of its last token.
      const int64_t closed = num_tokens / s.tokens;
      if (s.tokens <= bs) {
        const int64_t per_block = bs / s.tokens;
        for (int64_t k = 0; k * per_block < closed; ++k) {
          const int64_t n = std::min(per_block, closed - k * per_block);
          out.push_back({layer, page_offset(k), static_cast<size_t>(n) * p.entry_bytes});
        }
      } else {
        for (int64_t w = 0; w < closed; ++w) {
          out.push_back({layer, page_offset(((w + 1) * s.tokens - 1) / bs), p.entry_bytes});
        }
      }
    }
  }
  return out;
}

}  // namespace tandem
