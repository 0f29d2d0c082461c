// DeepSeek-V4's declared KV streams against what its forward pass really keeps: every
// value v4::SequenceState holds is in a declared stream, with the declared width and
// count, so a paged cache sized from the declaration holds the whole state.
#include "engine/model/deepseek_v4/v4_kv_streams.h"

#include <map>
#include <random>

#include "engine/model/deepseek_v4/v4_model.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

std::map<std::string, KvStream> ByName(const std::vector<KvStream>& streams) {
  std::map<std::string, KvStream> m;
  for (const KvStream& s : streams) m[s.name] = s;
  return m;
}

bool On(const KvStream& s, int64_t layer) {
  return std::find(s.layers.begin(), s.layers.end(), static_cast<int32_t>(layer)) != s.layers.end();
}

// The meaningful values of one compressor's unfinished window and overlap half.
int64_t StateValues(const CompressorState& s) {
  return 2 * s.partial_tokens * s.proj_width + (s.has_overlap ? 2 * s.rate * s.width : 0);
}

TEST(V4KvStreamsTest, TheStreamsHoldEveryValueOfTheState) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "tiny-v4", TinyV4Json().dump());
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> m = DeepseekV4Model::Load(dir, {.num_threads = 2});
  ASSERT_TRUE(m.ok()) << m.status();
  const DeepseekV4Config& c = (*m)->config();
  const std::vector<KvStream> streams = KvStreamsFor(c);
  ASSERT_TRUE(ValidateKvStreams(streams, static_cast<int32_t>(c.num_hidden_layers), 64).ok());
  std::map<std::string, KvStream> s = ByName(streams);
  ASSERT_EQ(s.size(), 7u) << DescribeKvStreams(streams);  // tiny-v4 has sliding, CSA and HCA layers

  std::mt19937 rng(5);
  std::vector<int32_t> tokens(static_cast<size_t>(2 * c.compress_rate_hca * 4 - 1));  // every window one short
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 512);
  SequenceState state = (*m)->NewSequence();
  ASSERT_TRUE((*m)->Forward(tokens, state).ok());
  const int64_t n = state.num_tokens;

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l << " (" << AttentionTypeName(c.layer_types[l]) << ")");
    const LayerState& ls = state.layers[l];
    ASSERT_TRUE(On(s["window"], l));
    EXPECT_EQ(static_cast<int64_t>(ls.window.size()), int64_t{s["window"].tokens} * s["window"].width);
    const bool csa = c.layer_types[l] == AttentionType::kCompressedSparse;
    const bool hca = c.layer_types[l] == AttentionType::kHeavilyCompressed;
    for (const char* name : {"csa_entries", "csa_index_keys", "csa_compressor", "csa_indexer"}) {
      EXPECT_EQ(On(s[name], l), csa) << name;
    }
    for (const char* name : {"hca_entries", "hca_compressor"}) EXPECT_EQ(On(s[name], l), hca) << name;
    if (!csa && !hca) {
      EXPECT_FALSE(ls.compressor.has_value());
      continue;
    }
    ASSERT_TRUE(ls.compressor.has_value());
    const KvStream& entries = s[csa ? "csa_entries" : "hca_entries"];
    const KvStream& state_rows = s[csa ? "csa_compressor" : "hca_compressor"];
    EXPECT_EQ(ls.compressor->num_entries, n / entries.tokens);
    EXPECT_EQ(ls.compressor->width, entries.width);
    EXPECT_EQ(static_cast<int64_t>(ls.compressor->entries.size()), ls.compressor->num_entries * entries.width);
    // The longest unfinished window (rate - 1 tokens) and the overlap fill the rows exactly.
    EXPECT_EQ(ls.compressor->partial_tokens, entries.tokens - 1);
    EXPECT_EQ(ls.compressor->width, state_rows.width);
    EXPECT_EQ(StateValues(*ls.compressor), int64_t{state_rows.tokens} * state_rows.width);
    ASSERT_EQ(ls.indexer.has_value(), csa);
    if (csa) {
      EXPECT_EQ(ls.indexer->num_entries, n / s["csa_index_keys"].tokens);
      EXPECT_EQ(static_cast<int64_t>(ls.indexer->entries.size()), ls.indexer->num_entries * s["csa_index_keys"].width);
      EXPECT_EQ(ls.indexer->width, s["csa_indexer"].width);
      EXPECT_EQ(StateValues(*ls.indexer), int64_t{s["csa_indexer"].tokens} * s["csa_indexer"].width);
    }
  }
}

TEST(V4KvStreamsTest, ASlidingOnlyModelHasOnlyTheWindow) {
  DeepseekV4Config c;
  c.num_hidden_layers = 2;
  c.layer_types = {AttentionType::kSliding, AttentionType::kSliding};
  const std::vector<KvStream> streams = KvStreamsFor(c);
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0].name, "window");
  EXPECT_EQ(streams[0].layers, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(streams[0].tokens, c.sliding_window);
}

}  // namespace
}  // namespace tandem::v4
