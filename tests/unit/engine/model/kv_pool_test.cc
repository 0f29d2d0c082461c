// The KV pool's placement of a layout's streams: every page and sequence row of every
// stream lies inside the region and overlaps no other; a single per-token stream is
// exactly LatentKvCache's geometry (what the transfer and the checksums assume); windows
// land in the block of their last token; bad geometries are errors, not overflows.
#include "engine/model/kv_pool.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/model/latent_kv_cache.h"

namespace tandem {
namespace {

std::vector<int32_t> Layers(int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(i);
  return v;
}

std::vector<KvStream> V4Like() {
  return {
      {.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing, .tokens = 16, .width = 32,
       .layers = Layers(4)},
      {.name = "csa", .dtype = "bf16", .granularity = KvGranularity::kPerWindow, .tokens = 4, .width = 32,
       .layers = {1, 3}},
      {.name = "hca", .dtype = "fp8_e4m3", .granularity = KvGranularity::kPerWindow, .tokens = 128, .width = 32,
       .layers = {2}},
      {.name = "state", .dtype = "f32", .granularity = KvGranularity::kSequenceState, .tokens = 20, .width = 8,
       .layers = {1, 3}},
  };
}

TEST(KvPoolTest, OneLatentStreamIsLatentKvCacheGeometry) {
  const int32_t layers = 3, entry = 24;
  const int64_t blocks = 5;
  KvStream latent{.name = "latent", .dtype = "f32", .granularity = KvGranularity::kPerToken, .tokens = 1,
                  .width = entry, .layers = Layers(layers)};
  const KvPool::Geometry g{.num_layers = layers, .block_size = 64, .num_blocks = blocks};
  ASSERT_EQ(*KvPool::BytesFor({latent}, g), LatentKvCache::BytesFor(layers, blocks, entry));
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create({latent}, g);
  ASSERT_TRUE(pool.ok()) << pool.status();
  LatentKvCache cache(reinterpret_cast<float*>((*pool)->memory().data()), layers, blocks, entry);
  const std::vector<int32_t> table = {3, 0, 4};
  for (int32_t l = 0; l < layers; ++l) {
    for (int64_t p : {0, 1, 63, 64, 100, 191}) {
      EXPECT_EQ(reinterpret_cast<float*>((*pool)->Entry(0, l, table, p)), cache.Entry(l, table, p)) << l << " " << p;
    }
    for (int32_t b = 0; b < blocks; ++b) {
      EXPECT_EQ(reinterpret_cast<float*>((*pool)->Page(0, l, b).data()), cache.Block(l, b).data());
      EXPECT_EQ((*pool)->Page(0, l, b).size(), cache.Block(l, b).size_bytes());
    }
  }
}

TEST(KvPoolTest, EveryPageAndRowHasItsOwnBytes) {
  const KvPool::Geometry g{.num_layers = 4, .block_size = 64, .num_blocks = 6, .num_sequence_slots = 3};
  absl::StatusOr<std::unique_ptr<KvPool>> made = KvPool::Create(V4Like(), g);
  ASSERT_TRUE(made.ok()) << made.status();
  KvPool& pool = **made;
  std::vector<int> owner(pool.memory().size(), -1);
  int id = 0;
  auto claim = [&](std::span<std::byte> r) {
    ASSERT_GE(r.data(), pool.memory().data());
    ASSERT_LE(r.data() + r.size(), pool.memory().data() + pool.memory().size());
    const size_t at = static_cast<size_t>(r.data() - pool.memory().data());
    for (size_t i = 0; i < r.size(); ++i) {
      ASSERT_EQ(owner[at + i], -1) << "byte " << at + i << " claimed twice";
      owner[at + i] = id;
    }
    ++id;
  };
  size_t claimed = 0;
  for (int s = 0; s < static_cast<int>(pool.streams().size()); ++s) {
    const KvStream& st = pool.streams()[s];
    size_t stream_bytes = 0;
    for (int32_t l : st.layers) {
      if (IsPaged(st)) {
        for (int32_t b = 0; b < g.num_blocks; ++b) {
          claim(pool.Page(s, l, b));
          stream_bytes += pool.Page(s, l, b).size();
        }
      } else {
        for (int64_t slot = 0; slot < g.num_sequence_slots; ++slot) {
          claim(pool.SequenceRows(s, l, slot));
          stream_bytes += pool.SequenceRows(s, l, slot).size();
          EXPECT_EQ(pool.SequenceRows(s, l, slot).size(),
                    static_cast<size_t>(st.tokens * st.width * KvDtypeBytes(st.dtype)));
        }
      }
    }
    EXPECT_EQ(stream_bytes, pool.StreamBytes(s)) << st.name;
    EXPECT_EQ(pool.StreamOffset(s) % 256, 0u) << st.name;
    claimed += stream_bytes;
  }
  EXPECT_EQ(static_cast<int64_t>(claimed),
            PagedBytesPerBlock(pool.streams(), 64) * g.num_blocks + SequenceStateBytes(pool.streams()) * 3);
  // Paged streams first: the block region is one piece at the start.
  EXPECT_LT(pool.StreamOffset(1), pool.StreamOffset(0));
  EXPECT_LT(pool.StreamOffset(2), pool.StreamOffset(0));
}

TEST(KvPoolTest, WindowsLandInTheBlockOfTheirLastToken) {
  const KvPool::Geometry g{.num_layers = 4, .block_size = 64, .num_blocks = 6, .num_sequence_slots = 1};
  std::unique_ptr<KvPool> pool = *KvPool::Create(V4Like(), g);
  const std::vector<int32_t> table = {5, 2, 0, 4};
  const int csa = pool->StreamIndex("csa"), hca = pool->StreamIndex("hca");
  ASSERT_GE(csa, 0);
  EXPECT_EQ(pool->StreamIndex("nope"), -1);
  // CSA windows of 4: 16 a block, window w in entry w % 16 of block w / 16.
  for (int64_t p : {0, 3, 4, 63, 64, 130, 255}) {
    const int64_t w = p / 4;
    EXPECT_EQ(pool->Entry(csa, 3, table, p), pool->Page(csa, 3, table[w / 16]).data() + (w % 16) * 32 * 2) << p;
  }
  // HCA windows of 128: the one slot of the block holding the window's last token.
  EXPECT_EQ(pool->Entry(hca, 2, table, 0), pool->Page(hca, 2, table[1]).data());
  EXPECT_EQ(pool->Entry(hca, 2, table, 127), pool->Page(hca, 2, table[1]).data());
  EXPECT_EQ(pool->Entry(hca, 2, table, 128), pool->Page(hca, 2, table[3]).data());
}

TEST(KvPoolTest, BadGeometriesAreErrors) {
  const std::vector<KvStream> s = V4Like();
  EXPECT_EQ(KvPool::Create(s, {.num_layers = 4, .block_size = 64, .num_blocks = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(s, {.num_layers = 3, .block_size = 64, .num_blocks = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);  // layer 3 is outside the model
  const absl::StatusOr<size_t> huge =
      KvPool::BytesFor(s, {.num_layers = 4, .block_size = 64, .num_blocks = int64_t{1} << 62, .num_sequence_slots = 1});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("overflows"), std::string::npos) << huge.status();
  const KvPool::Geometry g{.num_layers = 4, .block_size = 64, .num_blocks = 2, .num_sequence_slots = 1};
  std::vector<std::byte> small(*KvPool::BytesFor(s, g) - 1);
  EXPECT_EQ(KvPool::CreateOver(small, s, g).status().code(), absl::StatusCode::kInvalidArgument);
  small.resize(small.size() + 1);
  EXPECT_TRUE(KvPool::CreateOver(small, s, g).ok());
}

}  // namespace
}  // namespace tandem
