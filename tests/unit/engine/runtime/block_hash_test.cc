#include "engine/runtime/block_hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "xxhash.h"

namespace tandem {
namespace {

KvLayout TestLayout() {
  KvLayout l{.model_id = "deepseek_v3:0123456789abcdef", .block_size = 64, .num_layers = 61, .layout_version = 2};
  KvStream latent{.name = "latent", .dtype = "bf16", .granularity = KvGranularity::kPerToken, .tokens = 1,
                  .width = 576};
  for (int32_t i = 0; i < 61; ++i) latent.layers.push_back(i);
  l.streams.push_back(latent);
  l.streams.push_back({.name = "hca_entries", .dtype = "f32", .granularity = KvGranularity::kPerWindow,
                       .tokens = 128, .width = 512, .layers = {1, 3}});
  return l;
}

std::vector<int32_t> Iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

void AppendLe(std::vector<unsigned char>* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
}

void AppendString(std::vector<unsigned char>* out, const std::string& s) {
  AppendLe(out, s.size(), 4);
  out->insert(out->end(), s.begin(), s.end());
}

// The documented encodings, built byte by byte.
TEST(BlockHashTest, MatchesDocumentedEncodings) {
  const KvLayout layout = TestLayout();
  std::vector<unsigned char> bytes;
  AppendString(&bytes, layout.model_id);
  for (int32_t v : {layout.block_size, layout.num_layers, layout.layout_version}) {
    AppendLe(&bytes, static_cast<uint32_t>(v), 4);
  }
  AppendLe(&bytes, layout.streams.size(), 4);
  for (const KvStream& s : layout.streams) {
    AppendString(&bytes, s.name);
    AppendString(&bytes, s.dtype);
    for (int32_t v : {static_cast<int32_t>(s.granularity), s.tokens, s.width}) {
      AppendLe(&bytes, static_cast<uint32_t>(v), 4);
    }
    AppendLe(&bytes, s.layers.size(), 4);
    for (int32_t v : s.layers) AppendLe(&bytes, static_cast<uint32_t>(v), 4);
  }
  const uint64_t fp = LayoutFingerprint(layout);
  EXPECT_EQ(fp, XXH3_64bits(bytes.data(), bytes.size()));

  const std::vector<int32_t> tokens = {1, -2, 70000, 0x7fffffff};
  bytes.clear();
  AppendLe(&bytes, 0x1122334455667788ull, 8);
  AppendLe(&bytes, fp, 8);
  for (int32_t t : tokens) AppendLe(&bytes, static_cast<uint32_t>(t), 4);
  EXPECT_EQ(HashBlock(0x1122334455667788ull, tokens, fp), XXH3_64bits(bytes.data(), bytes.size()));
}

// Regression guard: these values are shared with other processes (kvstore, router) and
// must never change silently. If this fails, the wire meaning of every hash changed.
TEST(BlockHashTest, KnownValues) {
  const uint64_t fp = LayoutFingerprint(TestLayout());
  EXPECT_EQ(fp, 0x7856f89939183243ull);
  const std::vector<uint64_t> hashes = HashFullBlocks(Iota(130), 64, fp);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(hashes[0], 0xfb0054adfdd3cd25ull);
  EXPECT_EQ(hashes[1], 0x4bea10df516f09c2ull);
  EXPECT_EQ(kRootBlockParentHash, 0x74616e64656d4b56ull);
  EXPECT_EQ(hashes[0], HashBlock(kRootBlockParentHash, Iota(64), fp));
  EXPECT_EQ(hashes[1], HashBlock(hashes[0], Iota(64, 64), fp));
}

TEST(BlockHashTest, FingerprintCoversEveryField) {
  const KvLayout base = TestLayout();
  std::set<uint64_t> seen = {LayoutFingerprint(base)};
  auto expect_new = [&](const KvLayout& l) { EXPECT_TRUE(seen.insert(LayoutFingerprint(l)).second); };
  KvLayout l = base; l.model_id = "deepseek_v3:0123456789abcdee"; expect_new(l);
  l = base; l.block_size = 32; expect_new(l);
  l = base; l.num_layers = 60; expect_new(l);
  l = base; l.layout_version = 3; expect_new(l);
  l = base; l.streams[0].name = "latent2"; expect_new(l);
  l = base; l.streams[0].dtype = "fp8_e4m3"; expect_new(l);
  l = base; l.streams[1].granularity = KvGranularity::kRing; expect_new(l);
  l = base; l.streams[1].tokens = 64; expect_new(l);
  l = base; l.streams[0].width = 512; expect_new(l);
  l = base; l.streams[1].layers = {1, 2}; expect_new(l);
  l = base; l.streams[1].layers = {1}; expect_new(l);
  l = base; l.streams.pop_back(); expect_new(l);
  l = base; std::swap(l.streams[0], l.streams[1]); expect_new(l);
  // Strings are length-prefixed: moving bytes between fields changes the fingerprint.
  l = base; l.streams[0].name = "ab"; l.streams[0].dtype = "c"; expect_new(l);
  l = base; l.streams[0].name = "a"; l.streams[0].dtype = "bc"; expect_new(l);
  // Equal layouts, equal fingerprints.
  EXPECT_EQ(LayoutFingerprint(base), LayoutFingerprint(TestLayout()));
}

TEST(BlockHashTest, SharedPrefixSharesExactlyThoseHashes) {
  const uint64_t fp = LayoutFingerprint(TestLayout());
  constexpr int32_t kBs = 16;
  for (int k = 0; k <= 4; ++k) {
    std::vector<int32_t> a = Iota(5 * kBs + 3);
    std::vector<int32_t> b = a;
    b[k * kBs + 7] += 1;  // first difference inside block k
    const auto ha = HashFullBlocks(a, kBs, fp);
    const auto hb = HashFullBlocks(b, kBs, fp);
    ASSERT_EQ(ha.size(), 5u);
    ASSERT_EQ(hb.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      if (i < k) {
        EXPECT_EQ(ha[i], hb[i]) << "k=" << k << " block " << i;
      } else {
        EXPECT_NE(ha[i], hb[i]) << "k=" << k << " block " << i;  // the chain carries it on
      }
    }
  }
}

TEST(BlockHashTest, FingerprintChangesEveryHash) {
  KvLayout other = TestLayout();
  other.streams[0].dtype = "f32";
  const auto tokens = Iota(4 * 64);
  const auto a = HashFullBlocks(tokens, 64, LayoutFingerprint(TestLayout()));
  const auto b = HashFullBlocks(tokens, 64, LayoutFingerprint(other));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << i;
}

TEST(BlockHashTest, PartialBlockHasNoHash) {
  const uint64_t fp = 42;
  EXPECT_TRUE(HashFullBlocks({}, 64, fp).empty());
  EXPECT_TRUE(HashFullBlocks(Iota(63), 64, fp).empty());
  EXPECT_EQ(HashFullBlocks(Iota(64), 64, fp).size(), 1u);
  // The partial tail is ignored whatever it holds.
  auto with_tail = Iota(64 * 2 + 5);
  EXPECT_EQ(HashFullBlocks(with_tail, 64, fp), HashFullBlocks(std::span(with_tail).first(128), 64, fp));
  with_tail.back() = 999;
  EXPECT_EQ(HashFullBlocks(with_tail, 64, fp), HashFullBlocks(std::span(with_tail).first(128), 64, fp));
}

TEST(BlockHashTest, BlockBoundariesMatter) {
  const uint64_t fp = 7;
  const auto tokens = Iota(8);
  const auto by4 = HashFullBlocks(tokens, 4, fp);
  const auto by2 = HashFullBlocks(tokens, 2, fp);
  const auto by8 = HashFullBlocks(tokens, 8, fp);
  ASSERT_EQ(by4.size(), 2u);
  ASSERT_EQ(by2.size(), 4u);
  ASSERT_EQ(by8.size(), 1u);
  std::set<uint64_t> all(by4.begin(), by4.end());
  all.insert(by2.begin(), by2.end());
  all.insert(by8.begin(), by8.end());
  EXPECT_EQ(all.size(), 7u);  // no hash of one split equals a hash of another
  // Same for the chain itself: [0 1][2 3] chained is not [0 1 2 3].
  const uint64_t h01 = HashBlock(kRootBlockParentHash, std::span(tokens).first(2), fp);
  EXPECT_NE(HashBlock(h01, std::span(tokens).subspan(2, 2), fp),
            HashBlock(kRootBlockParentHash, std::span(tokens).first(4), fp));
}

TEST(BlockHashTest, ParentAndOrderMatter) {
  const auto tokens = Iota(4);
  EXPECT_NE(HashBlock(1, tokens, 9), HashBlock(2, tokens, 9));
  EXPECT_NE(HashBlock(1, tokens, 9), HashBlock(9, tokens, 1));  // parent and fingerprint not interchangeable
  const std::vector<int32_t> swapped = {1, 0, 2, 3};
  EXPECT_NE(HashBlock(1, tokens, 9), HashBlock(1, swapped, 9));
}

TEST(BlockHashTest, ExtendMatchesFullHashing) {
  const uint64_t fp = LayoutFingerprint(TestLayout());
  const auto tokens = Iota(16 * 7 + 3, 1000);
  std::vector<uint64_t> incremental;
  for (size_t len = 0; len <= tokens.size(); ++len) {
    ExtendBlockHashes(std::span(tokens).first(len), 16, fp, &incremental);
    ASSERT_EQ(incremental, HashFullBlocks(std::span(tokens).first(len), 16, fp)) << len;
  }
}

TEST(BlockHashDeathTest, NonPositiveBlockSizeAborts) {
  const auto tokens = Iota(8);
  EXPECT_DEATH(HashFullBlocks(tokens, 0, 1), "block_size");
  std::vector<uint64_t> too_many(3, 0);
  EXPECT_DEATH(ExtendBlockHashes(tokens, 4, 1, &too_many), "more hashes than full blocks");
}

}  // namespace
}  // namespace tandem
