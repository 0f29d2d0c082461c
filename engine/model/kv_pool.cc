#include "engine/model/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

constexpr size_t kStreamAlignment = 256;

// a * b into *out, false on overflow.
bool Mul(size_t a, size_t b, size_t* out) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<KvPool::StreamPlace>> KvPool::Plan(const std::vector<KvStream>& streams, const Geometry& g,
                                                              size_t* total) {
  if (g.num_blocks <= 0 || g.num_sequence_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool of ", g.num_blocks, " blocks and ", g.num_sequence_slots, " sequence slots"));
  }
  if (absl::Status s = ValidateKvStreams(streams, g.num_layers, g.block_size); !s.ok()) return s;
  std::vector<StreamPlace> places(streams.size());
  size_t offset = 0;
  for (int paged_pass = 1; paged_pass >= 0; --paged_pass) {
    for (size_t i = 0; i < streams.size(); ++i) {
      const KvStream& s = streams[i];
      if (IsPaged(s) != (paged_pass == 1)) continue;
      StreamPlace& p = places[i];
      p.entry_bytes = static_cast<size_t>(s.width) * static_cast<size_t>(KvDtypeBytes(s.dtype));
      p.layer_index.assign(static_cast<size_t>(g.num_layers), -1);
      for (size_t l = 0; l < s.layers.size(); ++l) {
        p.layer_index[static_cast<size_t>(s.layers[l])] = static_cast<int32_t>(l);
      }
      size_t rows = 0;
      if (IsPaged(s)) {
        p.entries_per_block = EntriesPerBlock(s, g.block_size);
        if (!Mul(static_cast<size_t>(g.num_blocks), static_cast<size_t>(p.entries_per_block), &rows)) rows = SIZE_MAX;
      } else if (!Mul(static_cast<size_t>(g.num_sequence_slots), static_cast<size_t>(s.tokens), &rows)) {
        rows = SIZE_MAX;
      }
      size_t bytes = 0;
      if (rows == SIZE_MAX || !Mul(rows, s.layers.size(), &bytes) || !Mul(bytes, p.entry_bytes, &bytes) ||
          offset > std::numeric_limits<size_t>::max() - bytes - kStreamAlignment) {
        return absl::InvalidArgumentError(absl::StrCat("KV stream '", s.name, "': the pool's size overflows"));
      }
      offset = (offset + kStreamAlignment - 1) / kStreamAlignment * kStreamAlignment;
      p.offset = offset;
      p.bytes = bytes;
      offset += bytes;
    }
  }
  *total = offset;
  return places;
}

absl::StatusOr<size_t> KvPool::BytesFor(const std::vector<KvStream>& streams, const Geometry& g) {
  size_t total = 0;
  absl::StatusOr<std::vector<StreamPlace>> plan = Plan(streams, g, &total);
  if (!plan.ok()) return plan.status();
  return total;
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(std::vector<KvStream> streams, const Geometry& g) {
  size_t total = 0;
  absl::StatusOr<std::vector<StreamPlace>> plan = Plan(streams, g, &total);
  if (!plan.ok()) return plan.status();
  std::unique_ptr<std::byte[]> owned(new (std::nothrow) std::byte[total]());
  if (owned == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV pool of ", total, " bytes"));
  }
  std::span<std::byte> memory(owned.get(), total);
  return std::unique_ptr<KvPool>(new KvPool(std::move(streams), g, std::move(*plan), memory, std::move(owned)));
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::CreateOver(std::span<std::byte> memory, std::vector<KvStream> streams,
                                                           const Geometry& g) {
  size_t total = 0;
  absl::StatusOr<std::vector<StreamPlace>> plan = Plan(streams, g, &total);
  if (!plan.ok()) return plan.status();
  if (memory.size() < total) {
    return absl::InvalidArgumentError(
        absl::StrCat("the KV memory given (", memory.size(), " bytes) is smaller than the pool's ", total));
  }
  return std::unique_ptr<KvPool>(new KvPool(std::move(streams), g, std::move(*plan), memory.first(total), nullptr));
}

int KvPool::StreamIndex(std::string_view name) const {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int KvPool::Check(int s) const {
  TANDEM_CHECK(s >= 0 && s < static_cast<int>(streams_.size())) << "KV stream " << s;
  return s;
}

int64_t KvPool::LayerIndex(int s, int32_t layer) const {
  TANDEM_CHECK(layer >= 0 && layer < geometry_.num_layers) << "layer " << layer;
  const int32_t i = layout_[Check(s)].layer_index[static_cast<size_t>(layer)];
  TANDEM_CHECK_GE(i, 0) << "KV stream '" << streams_[s].name << "' is not on layer " << layer;
  return i;
}

std::span<std::byte> KvPool::Page(int s, int32_t layer, int32_t block) {
  const int64_t i = LayerIndex(s, layer);
  TANDEM_CHECK(IsPaged(streams_[s])) << "KV stream '" << streams_[s].name << "' is not paged";
  TANDEM_CHECK(block >= 0 && block < geometry_.num_blocks) << "block " << block;
  const StreamPlace& p = layout_[s];
  const size_t page = static_cast<size_t>(p.entries_per_block) * p.entry_bytes;
  return memory_.subspan(p.offset + (static_cast<size_t>(i) * geometry_.num_blocks + block) * page, page);
}

std::byte* KvPool::Entry(int s, int32_t layer, std::span<const int32_t> block_table, int64_t position) {
  const KvStream& st = streams_[Check(s)];
  TANDEM_CHECK_GE(position, 0);
  const int64_t bs = geometry_.block_size;
  int64_t token = position, entry = position % bs;
  if (st.granularity == KvGranularity::kPerWindow) {
    const int64_t window = position / st.tokens;
    token = (window + 1) * st.tokens - 1;  // the window's last token decides the block
    entry = st.tokens <= bs ? window % (bs / st.tokens) : 0;
  }
  const int64_t b = token / bs;
  TANDEM_CHECK_LT(b, static_cast<int64_t>(block_table.size())) << "position " << position;
  return Page(s, layer, block_table[static_cast<size_t>(b)]).data() + entry * layout_[s].entry_bytes;
}

std::span<std::byte> KvPool::SequenceRows(int s, int32_t layer, int64_t slot) {
  const int64_t i = LayerIndex(s, layer);
  const KvStream& st = streams_[s];
  TANDEM_CHECK(!IsPaged(st)) << "KV stream '" << st.name << "' is paged";
  TANDEM_CHECK(slot >= 0 && slot < geometry_.num_sequence_slots) << "sequence slot " << slot;
  const StreamPlace& p = layout_[s];
  const size_t rows = static_cast<size_t>(st.tokens) * p.entry_bytes;
  return memory_.subspan(p.offset + (static_cast<size_t>(slot) * st.layers.size() + i) * rows, rows);
}

void KvPool::CopySequenceSlot(int64_t from, int64_t to) {
  TANDEM_CHECK(from >= 0 && from < geometry_.num_sequence_slots && to >= 0 && to < geometry_.num_sequence_slots)
      << "sequence slots " << from << " -> " << to;
  if (from == to) return;
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (IsPaged(streams_[s])) continue;
    // A slot's rows of one stream are contiguous over its layers.
    const StreamPlace& p = layout_[s];
    const size_t bytes = streams_[s].layers.size() * static_cast<size_t>(streams_[s].tokens) * p.entry_bytes;
    std::memcpy(memory_.data() + p.offset + static_cast<size_t>(to) * bytes,
                memory_.data() + p.offset + static_cast<size_t>(from) * bytes, bytes);
  }
}

std::vector<std::span<std::byte>> KvPool::BlockImage(int32_t block) {
  std::vector<std::span<std::byte>> out;
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (!IsPaged(streams_[s])) continue;
    for (int32_t layer : streams_[s].layers) out.push_back(Page(static_cast<int>(s), layer, block));
  }
  return out;
}

std::vector<std::span<std::byte>> KvPool::StateImage(int64_t slot) {
  TANDEM_CHECK(slot >= 0 && slot < geometry_.num_sequence_slots) << "sequence slot " << slot;
  std::vector<std::span<std::byte>> out;
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (IsPaged(streams_[s])) continue;
    // A slot's rows of one stream are contiguous over its layers.
    const StreamPlace& p = layout_[s];
    const size_t bytes = streams_[s].layers.size() * static_cast<size_t>(streams_[s].tokens) * p.entry_bytes;
    out.push_back(memory_.subspan(p.offset + static_cast<size_t>(slot) * bytes, bytes));
  }
  return out;
}

int64_t KvPool::BlockImageBytes() const { return PagedBytesPerBlock(streams_, geometry_.block_size); }
int64_t KvPool::StateImageBytes() const { return SequenceStateBytes(streams_); }

std::vector<std::span<const std::byte>> ReadOnly(const std::vector<std::span<std::byte>>& ranges) {
  return std::vector<std::span<const std::byte>>(ranges.begin(), ranges.end());
}

void CopyConcatenated(std::span<const std::span<const std::byte>> from, std::span<const std::span<std::byte>> to) {
  size_t total_from = 0, total_to = 0;
  for (const auto& f : from) total_from += f.size();
  for (const auto& t : to) total_to += t.size();
  TANDEM_CHECK_EQ(total_from, total_to) << "images of different lengths";
  size_t fi = 0, fo = 0;  // piece of `from`, offset in it
  for (const std::span<std::byte>& t : to) {
    size_t done = 0;
    while (done < t.size()) {
      while (fo == from[fi].size()) {
        ++fi;
        fo = 0;
      }
      const size_t n = std::min(t.size() - done, from[fi].size() - fo);
      std::memcpy(t.data() + done, from[fi].data() + fo, n);
      done += n;
      fo += n;
    }
  }
}

}  // namespace tandem
