// The KV memory of a layout's streams (kv_streams.h) in one region, so that a transfer
// layer can register it once and peers can write into it:
//   - paged streams (per token, per window) in token blocks shared through block tables:
//     stream s, layer index i (the i-th of s.layers), block b, entry e starts at
//       base(s) + ((i * num_blocks + b) * EntriesPerBlock(s) + e) * width * dtype bytes,
//     layer-major as the transfer moves it; one per-token stream at base 0 is exactly
//     LatentKvCache's [layer][block][slot][entry] geometry;
//   - per-sequence streams (rings, states) in sequence slots the caller hands out:
//       base(s) + ((slot * layers + i) * tokens + row) * width * dtype bytes.
// Streams follow one another in layout order, paged first, each base aligned to 256 bytes.
// Which blocks and slots a sequence owns is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/kv_streams.h"

namespace tandem {

// One contiguous byte range of a sequence's KV in a pool (KvPool::SequenceExtents).
struct KvExtent {
  int32_t layer = 0;  // the model layer the bytes belong to
  size_t offset = 0;  // from the pool's first byte
  size_t bytes = 0;
};

// The bytes of `extents` together.
inline size_t KvExtentsBytes(std::span<const KvExtent> extents) {
  size_t n = 0;
  for (const KvExtent& e : extents) n += e.bytes;
  return n;
}

// Copies the concatenation of `from` over the concatenation of `to`; their total lengths
// must be equal (checked). For images split differently at both ends (KvPool::BlockImage,
// a store's fixed-size chunks).
void CopyConcatenated(std::span<const std::span<const std::byte>> from, std::span<const std::span<std::byte>> to);
// The same ranges, read-only (for CopyConcatenated's `from`).
std::vector<std::span<const std::byte>> ReadOnly(const std::vector<std::span<std::byte>>& ranges);

class KvPool {
 public:
  struct Geometry {
    int32_t num_layers = 0;
    int32_t block_size = 0;
    int64_t num_blocks = 0;
    int64_t num_sequence_slots = 0;  // sequences that may hold ring/state streams at once
  };

  // Bytes the pool of `streams` takes (for a caller that provides the memory). Errors:
  // ValidateKvStreams's, or a geometry that is not positive or overflows.
  static absl::StatusOr<size_t> BytesFor(const std::vector<KvStream>& streams, const Geometry& g);
  // Over memory the pool owns (zeroed).
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(std::vector<KvStream> streams, const Geometry& g);
  // Over caller-owned memory of at least BytesFor bytes, which must outlive the pool.
  static absl::StatusOr<std::unique_ptr<KvPool>> CreateOver(std::span<std::byte> memory, std::vector<KvStream> streams,
                                                            const Geometry& g);

  const std::vector<KvStream>& streams() const { return streams_; }
  const Geometry& geometry() const { return geometry_; }
  std::span<std::byte> memory() { return memory_; }
  // The stream's index by name, or -1.
  int StreamIndex(std::string_view name) const;

  // Where stream `s` lives: its first byte's offset in memory() and its bytes.
  size_t StreamOffset(int s) const { return layout_[Check(s)].offset; }
  size_t StreamBytes(int s) const { return layout_[Check(s)].bytes; }

  // Paged streams. `layer` is a model layer the stream is on (checked). One block's
  // entries of one layer, contiguous; and the entry `position` of a sequence whose blocks
  // are `block_table` (a per-window stream: the entry of window position / tokens, in the
  // block of the window's last token).
  std::span<std::byte> Page(int s, int32_t layer, int32_t block);
  std::byte* Entry(int s, int32_t layer, std::span<const int32_t> block_table, int64_t position);

  // Per-sequence streams: slot `slot`'s rows of one layer, contiguous.
  std::span<std::byte> SequenceRows(int s, int32_t layer, int64_t slot);
  // Copies every per-sequence stream's rows of slot `from` over those of slot `to` (a
  // state snapshot taken or restored, prefix_states.h). Both slots are checked.
  void CopySequenceSlot(int64_t from, int64_t to);

  // Byte images, for the kvstore tier (a prefix computed by one replica, reused by
  // another): the ranges of the pool whose concatenation is
  //   - block `block`'s image: each paged stream's page of it, streams in layout order and
  //     each stream's layers in order (BlockImageBytes in all; for one per-token stream,
  //     exactly LatentKvCache's block bytes, [layer][slot][entry]);
  //   - slot `slot`'s state image: each per-sequence stream's rows of it, streams in
  //     layout order and layers in order (StateImageBytes in all).
  // Both are checked to be inside the pool. Copy with CopyConcatenated.
  std::vector<std::span<std::byte>> BlockImage(int32_t block);
  std::vector<std::span<std::byte>> StateImage(int64_t slot);
  int64_t BlockImageBytes() const;
  int64_t StateImageBytes() const;

  // What a sequence's KV for positions [0, num_tokens) occupies in a pool of `streams` and
  // `g` whose blocks are `block_table` and whose per-sequence streams are in `slot`: model
  // layers in order; within a layer, its streams in layout order; a per-token stream's
  // entries and a per-window stream's closed windows' entries, one extent per block; a
  // per-sequence stream's whole rows. Two pools of one layout list extents of the same
  // lengths in the same order, whatever their blocks and slots: a transfer pairs them up
  // and both ends checksum the same bytes. INVALID_ARGUMENT (naming what) for blocks or a
  // slot outside the pool, or too few blocks; never overflows, whatever the claim (a peer's
  // forged destination is checked with it).
  static absl::StatusOr<std::vector<KvExtent>> SequenceExtents(const std::vector<KvStream>& streams,
                                                               const Geometry& g, std::span<const int32_t> block_table,
                                                               int64_t slot, int64_t num_tokens);
  absl::StatusOr<std::vector<KvExtent>> SequenceExtents(std::span<const int32_t> block_table, int64_t slot,
                                                        int64_t num_tokens) const {
    return SequenceExtents(streams_, geometry_, block_table, slot, num_tokens);
  }

 private:
  struct StreamPlace {
    size_t offset = 0, bytes = 0;
    size_t entry_bytes = 0;      // width x dtype bytes
    int64_t entries_per_block = 0;  // paged
    std::vector<int32_t> layer_index;  // model layer -> index in the stream's layers, or -1
  };
  KvPool(std::vector<KvStream> streams, const Geometry& g, std::vector<StreamPlace> layout, std::span<std::byte> memory,
         std::unique_ptr<std::byte[]> owned)
      : streams_(std::move(streams)), geometry_(g), layout_(std::move(layout)), memory_(memory),
        owned_(std::move(owned)) {}
  static absl::StatusOr<std::vector<StreamPlace>> Plan(const std::vector<KvStream>& streams, const Geometry& g,
                                                       size_t* total);
  int Check(int s) const;
  int64_t LayerIndex(int s, int32_t layer) const;

  std::vector<KvStream> streams_;
  Geometry geometry_;
  std::vector<StreamPlace> layout_;
  std::span<std::byte> memory_;
  std::unique_ptr<std::byte[]> owned_;  // null when the memory is the caller's
};

}  // namespace tandem
