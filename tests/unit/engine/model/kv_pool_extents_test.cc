// KvPool::SequenceExtents, what a transfer moves: copying a sequence's extents from one
// pool into another of the same layout (other blocks, another slot, another size) gives
// every entry it holds (per token, closed windows, rings and states) and nothing else;
// the extents lie inside the pool without overlapping; forged block tables and slots are
// errors, not reads outside the pool.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "engine/model/kv_pool.h"

namespace tandem {
namespace {

std::vector<KvStream> Streams() {
  return {
      {.name = "latent", .dtype = "f32", .granularity = KvGranularity::kPerToken, .tokens = 1, .width = 6,
       .layers = {0, 1, 2}},
      {.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing, .tokens = 16, .width = 4,
       .layers = {0, 1, 2}},
      {.name = "csa", .dtype = "bf16", .granularity = KvGranularity::kPerWindow, .tokens = 4, .width = 8,
       .layers = {1}},
      {.name = "hca", .dtype = "fp8_e4m3", .granularity = KvGranularity::kPerWindow, .tokens = 128, .width = 16,
       .layers = {2}},
      {.name = "state", .dtype = "f32", .granularity = KvGranularity::kSequenceState, .tokens = 6, .width = 4,
       .layers = {1, 2}},
  };
}

// A distinct byte for every (stream, layer, position or row, byte).
std::byte Mark(int s, int32_t layer, int64_t i, size_t b) {
  return static_cast<std::byte>((s * 131 + layer * 31 + i * 7 + static_cast<int64_t>(b) * 3 + 1) % 251);
}

TEST(KvPoolExtentsTest, CopyingTheExtentsMovesEveryEntryOfTheSequence) {
  const std::vector<KvStream> streams = Streams();
  const KvPool::Geometry ga{.num_layers = 3, .block_size = 64, .num_blocks = 8, .num_sequence_slots = 3};
  const KvPool::Geometry gb{.num_layers = 3, .block_size = 64, .num_blocks = 11, .num_sequence_slots = 5};
  auto a = KvPool::Create(streams, ga), b = KvPool::Create(streams, gb);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t n : {1, 3, 4, 64, 127, 128, 130, 256}) {
    SCOPED_TRACE(n);
    const std::vector<int32_t> ta = {5, 2, 7, 0}, tb = {10, 3, 8, 1};
    const int32_t sa = 2, sb = 4;
    // Mark what the sequence holds in A.
    for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
      const KvStream& st = streams[s];
      for (int32_t l : st.layers) {
        if (!IsPaged(st)) {
          std::span<std::byte> rows = (*a)->SequenceRows(s, l, sa);
          for (size_t i = 0; i < rows.size(); ++i) rows[i] = Mark(s, l, 0, i);
          continue;
        }
        const int64_t entries = st.granularity == KvGranularity::kPerToken ? n : n / st.tokens;
        const size_t bytes = static_cast<size_t>(st.width * KvDtypeBytes(st.dtype));
        for (int64_t e = 0; e < entries; ++e) {
          std::byte* p = (*a)->Entry(s, l, ta, e * st.tokens);
          for (size_t i = 0; i < bytes; ++i) p[i] = Mark(s, l, e, i);
        }
      }
    }
    absl::StatusOr<std::vector<KvExtent>> ea = (*a)->SequenceExtents(ta, sa, n);
    absl::StatusOr<std::vector<KvExtent>> eb = (*b)->SequenceExtents(tb, sb, n);
    ASSERT_TRUE(ea.ok() && eb.ok()) << ea.status() << eb.status();
    ASSERT_EQ(ea->size(), eb->size());
    std::memset((*b)->memory().data(), 0, (*b)->memory().size());
    size_t total = 0;
    for (size_t i = 0; i < ea->size(); ++i) {
      ASSERT_EQ((*ea)[i].bytes, (*eb)[i].bytes);
      ASSERT_EQ((*ea)[i].layer, (*eb)[i].layer);
      ASSERT_LE((*eb)[i].offset + (*eb)[i].bytes, (*b)->memory().size());
      if (i > 0) EXPECT_LE((*ea)[i - 1].layer, (*ea)[i].layer) << "layers in order";
      std::memcpy((*b)->memory().data() + (*eb)[i].offset, (*a)->memory().data() + (*ea)[i].offset, (*ea)[i].bytes);
      total += (*ea)[i].bytes;
    }
    // Exactly the entries: per token n, per window the closed ones, and the rows.
    size_t expected = 0;
    for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
      const KvStream& st = streams[s];
      const size_t bytes = static_cast<size_t>(st.width * KvDtypeBytes(st.dtype)) * st.layers.size();
      if (!IsPaged(st)) expected += bytes * static_cast<size_t>(st.tokens);
      else expected += bytes * static_cast<size_t>(st.granularity == KvGranularity::kPerToken ? n : n / st.tokens);
      for (int32_t l : st.layers) {
        if (!IsPaged(st)) {
          std::span<std::byte> rows = (*b)->SequenceRows(s, l, sb);
          for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], Mark(s, l, 0, i)) << st.name;
          continue;
        }
        const int64_t entries = st.granularity == KvGranularity::kPerToken ? n : n / st.tokens;
        for (int64_t e = 0; e < entries; ++e) {
          const std::byte* p = (*b)->Entry(s, l, tb, e * st.tokens);
          for (size_t i = 0; i < static_cast<size_t>(st.width * KvDtypeBytes(st.dtype)); ++i) {
            ASSERT_EQ(p[i], Mark(s, l, e, i)) << st.name << " layer " << l << " entry " << e;
          }
        }
      }
    }
    EXPECT_EQ(total, expected);
  }
}

TEST(KvPoolExtentsTest, ExtentsDoNotOverlap) {
  const KvPool::Geometry g{.num_layers = 3, .block_size = 64, .num_blocks = 8, .num_sequence_slots = 3};
  absl::StatusOr<std::vector<KvExtent>> ex = KvPool::SequenceExtents(Streams(), g, {{6, 1, 4, 3}}, 1, 256);
  ASSERT_TRUE(ex.ok()) << ex.status();
  std::vector<KvExtent> sorted = *ex;
  std::sort(sorted.begin(), sorted.end(), [](const KvExtent& x, const KvExtent& y) { return x.offset < y.offset; });
  for (size_t i = 1; i < sorted.size(); ++i) EXPECT_LE(sorted[i - 1].offset + sorted[i - 1].bytes, sorted[i].offset);
}

TEST(KvPoolExtentsTest, ForgedTablesAndSlotsAreErrors) {
  const KvPool::Geometry g{.num_layers = 3, .block_size = 64, .num_blocks = 8, .num_sequence_slots = 3};
  const std::vector<KvStream> s = Streams();
  auto code = [&](std::vector<int32_t> table, int64_t slot, int64_t n) {
    return KvPool::SequenceExtents(s, g, table, slot, n).status().code();
  };
  EXPECT_EQ(code({0, 1}, 0, 128), absl::StatusCode::kOk);
  EXPECT_EQ(code({0, 8}, 0, 128), absl::StatusCode::kInvalidArgument);    // block outside the pool
  EXPECT_EQ(code({0, -1}, 0, 128), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({0}, 0, 65), absl::StatusCode::kInvalidArgument);        // too few blocks
  EXPECT_EQ(code({0, 1}, 3, 128), absl::StatusCode::kInvalidArgument);    // slot outside the pool
  EXPECT_EQ(code({0, 1}, -1, 128), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({0, 1}, 0, 0), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({0, 1}, 0, std::numeric_limits<int64_t>::max()), absl::StatusCode::kInvalidArgument);
  const KvPool::Geometry huge{.num_layers = 3, .block_size = 64, .num_blocks = int64_t{1} << 62,
                              .num_sequence_slots = 3};
  EXPECT_EQ(KvPool::SequenceExtents(s, huge, {{0}}, 0, 10).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
