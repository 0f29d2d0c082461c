// The MTP layer on the CPU (docs/speculative-decoding.md): its KV slots come out bitwise
// the same however they are reached (one prompt pass, chunks of any size, the draft pass
// after sampling), a recomputed cached position writes nothing, drafts chain and stop at
// the confidence threshold, and bad draft passes are refused.
#include <cstring>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;

constexpr int64_t kVocab = 512;
constexpr int kLength = 150;
constexpr int64_t kBlocks = 4;  // 256 positions: the prompt, its drafts' slots

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = (i * 53 + salt * 97 + 5) % (kVocab - 3) + 3;
  return p;
}

class DeepseekMtpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nlohmann::json c = nlohmann::json::parse(PresetJson("tiny"));
    c["vocab_size"] = kVocab;
    ASSERT_GE(c["num_nextn_predict_layers"].get<int>(), 1);
    dir_ = MakeModel(tmp_, "tiny", c.dump());
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir_, {.num_threads = 2, .mtp = true});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    layers_ = model_->config().num_hidden_layers;
  }

  LatentKvCache Cache() const {
    return LatentKvCache(layers_ + 1, kBlocks, model_->config().kv_entry_dim());
  }
  // The MTP layer's entries of slots [begin, end).
  std::vector<float> MtpSlots(LatentKvCache& cache, int64_t begin, int64_t end) const {
    std::vector<float> out;
    const int64_t dim = cache.entry_dim();
    for (int64_t q = begin; q < end; ++q) {
      const float* e = cache.Entry(layers_, table_, q);
      out.insert(out.end(), e, e + dim);
    }
    return out;
  }
  // The prompt through the model in chunks ending at `cuts` (the last at kLength), each
  // filling its MTP slots, the next token known except after the last.
  std::vector<float> PromptSlots(const std::vector<int32_t>& prompt, const std::vector<int>& cuts) {
    LatentKvCache cache = Cache();
    int begin = 0;
    for (int end : cuts) {
      ForwardSequence s{.tokens = std::span<const int32_t>(prompt.data() + begin, end - begin),
                        .start_position = begin,
                        .block_table = table_,
                        .mtp = true,
                        .mtp_next_token = end < kLength ? prompt[end] : -1};
      absl::StatusOr<std::vector<float>> logits = model_->Forward({&s, 1}, cache);
      EXPECT_TRUE(logits.ok()) << logits.status();
      begin = end;
    }
    return MtpSlots(cache, 1, kLength);
  }

  TempDir tmp_;
  std::string dir_;
  std::unique_ptr<DeepseekModel> model_;
  int64_t layers_ = 0;
  std::vector<int32_t> table_{2, 0, 3, 1};  // scattered blocks
};

TEST_F(DeepseekMtpTest, SlotsAreTheSameInOnePassAndInChunks) {
  const std::vector<int32_t> prompt = Tokens(kLength, 1);
  const std::vector<float> one = PromptSlots(prompt, {kLength});
  for (const std::vector<int>& cuts : std::vector<std::vector<int>>{{64, 128, kLength}, {1, 2, 77, kLength},
                                                                     {63, 65, 149, kLength}}) {
    const std::vector<float> chunked = PromptSlots(prompt, cuts);
    ASSERT_EQ(one.size(), chunked.size());
    EXPECT_EQ(std::memcmp(one.data(), chunked.data(), one.size() * sizeof(float)), 0)
        << "chunks ending at " << cuts[0] << ", " << cuts[1];
  }
}

TEST_F(DeepseekMtpTest, TheDraftPassFillsTheSlotAPromptChunkWould) {
  // Slot 100 from a chunk that knows token 100, and from the draft pass after a chunk that
  // does not (its hidden state kept).
  const std::vector<int32_t> prompt = Tokens(kLength, 2);
  LatentKvCache by_chunk = Cache();
  ForwardSequence s{.tokens = std::span<const int32_t>(prompt.data(), 100), .block_table = table_, .mtp = true,
                    .mtp_next_token = prompt[100]};
  ASSERT_TRUE(model_->Forward({&s, 1}, by_chunk).ok());

  LatentKvCache by_draft = Cache();
  s.mtp_next_token = -1;
  s.keep_hidden = true;
  ASSERT_TRUE(model_->Forward({&s, 1}, by_draft).ok());
  ASSERT_EQ(model_->kept_hidden().size(), static_cast<size_t>(100 * model_->config().hidden_size));
  DraftSequence d{.first_slot = 100, .tokens = std::span<const int32_t>(prompt.data() + 100, 1),
                  .hidden_row = 99, .block_table = table_, .max_drafts = 0};
  absl::StatusOr<std::vector<std::vector<DraftToken>>> drafts = model_->Draft({&d, 1}, by_draft);
  ASSERT_TRUE(drafts.ok()) << drafts.status();
  EXPECT_TRUE((*drafts)[0].empty());
  const std::vector<float> a = MtpSlots(by_chunk, 1, 101), b = MtpSlots(by_draft, 1, 101);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  // The same slot from a hidden state handed over (a prefill replica's) instead of a kept row.
  LatentKvCache handed = Cache();
  ASSERT_TRUE(model_->Forward({&s, 1}, handed).ok());
  const std::span<const float> kept = model_->kept_hidden();
  const int64_t hidden = model_->config().hidden_size;
  const std::vector<float> h(kept.begin() + 99 * hidden, kept.begin() + 100 * hidden);
  d.hidden = h;
  d.hidden_row = -1;
  ASSERT_TRUE(model_->Draft({&d, 1}, handed).ok());
  const std::vector<float> c = MtpSlots(handed, 1, 101);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
}

TEST_F(DeepseekMtpTest, ARecomputedCachedPositionWritesNothingAndKeepsItsHiddenState) {
  const std::vector<int32_t> prompt = Tokens(kLength, 3);
  const int64_t hidden = model_->config().hidden_size;
  LatentKvCache cache = Cache();
  ForwardSequence all{.tokens = std::span<const int32_t>(prompt.data(), 120), .block_table = table_,
                      .mtp = true, .keep_hidden = true};
  ASSERT_TRUE(model_->Forward({&all, 1}, cache).ok());
  const std::vector<float> want(model_->kept_hidden().begin() + 99 * hidden,
                                model_->kept_hidden().begin() + 100 * hidden);
  // Mark position 99's entry on a main layer and its MTP slot: a write would undo the marks.
  float* main_entry = cache.Entry(0, table_, 99);
  float* mtp_entry = cache.Entry(layers_, table_, 99);
  const float main_mark = main_entry[0] + 0.5f, mtp_mark = mtp_entry[0] + 0.5f;
  main_entry[0] = main_mark;
  mtp_entry[0] = mtp_mark;
  ForwardSequence again{.tokens = std::span<const int32_t>(prompt.data() + 99, 1), .start_position = 99,
                        .block_table = table_, .mtp = true, .mtp_next_token = prompt[100], .keep_hidden = true,
                        .first_kv_cached = true};
  ASSERT_TRUE(model_->Forward({&again, 1}, cache).ok());
  EXPECT_EQ(main_entry[0], main_mark);
  EXPECT_EQ(mtp_entry[0], mtp_mark);
  // Its hidden state saw the marked entry in layer 0's attention: compare on a clean run.
  main_entry[0] = main_mark - 0.5f;
  ASSERT_TRUE(model_->Forward({&again, 1}, cache).ok());
  const std::span<const float> got = model_->kept_hidden();
  ASSERT_EQ(got.size(), static_cast<size_t>(hidden));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(DeepseekMtpTest, DraftsChainAndStopBelowTheConfidenceThreshold) {
  const std::vector<int32_t> prompt = Tokens(kLength, 4);
  auto draft = [&](int32_t max_drafts, float min_confidence) {
    LatentKvCache cache = Cache();
    ForwardSequence s{.tokens = std::span<const int32_t>(prompt.data(), 99), .block_table = table_, .mtp = true,
                      .keep_hidden = true};
    EXPECT_TRUE(model_->Forward({&s, 1}, cache).ok());
    DraftSequence d{.first_slot = 99, .tokens = std::span<const int32_t>(prompt.data() + 99, 1), .hidden_row = 98,
                    .block_table = table_, .max_drafts = max_drafts, .min_confidence = min_confidence};
    absl::StatusOr<std::vector<std::vector<DraftToken>>> r = model_->Draft({&d, 1}, cache);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)[0] : std::vector<DraftToken>{};
  };
  const std::vector<DraftToken> four = draft(4, 0.0f);
  ASSERT_EQ(four.size(), 4u);
  for (const DraftToken& t : four) {
    EXPECT_GE(t.token, 0);
    EXPECT_LT(t.token, kVocab);
    EXPECT_GT(t.confidence, 0.0f);
    EXPECT_LE(t.confidence, 1.0f);
  }
  // A chain is a prefix of a longer one.
  const std::vector<DraftToken> two = draft(2, 0.0f);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].token, four[0].token);
  EXPECT_EQ(two[1].token, four[1].token);
  EXPECT_EQ(two[1].confidence, four[1].confidence);
  // The threshold stops the chain before the first draft below it.
  size_t low = 0;
  while (low < four.size() && four[low].confidence >= four[0].confidence) ++low;
  if (low < four.size()) {
    const std::vector<DraftToken> cut = draft(4, four[0].confidence);
    EXPECT_EQ(cut.size(), low);
  }
  EXPECT_TRUE(draft(4, 1.01f).empty());
}

TEST_F(DeepseekMtpTest, BadPassesAreRefused) {
  const std::vector<int32_t> prompt = Tokens(kLength, 5);
  LatentKvCache cache = Cache();
  ForwardSequence s{.tokens = std::span<const int32_t>(prompt.data(), 10), .block_table = table_, .mtp = true,
                    .keep_hidden = true};
  ASSERT_TRUE(model_->Forward({&s, 1}, cache).ok());
  DraftSequence d{.first_slot = 10, .tokens = std::span<const int32_t>(prompt.data() + 10, 1), .hidden_row = 10,
                  .block_table = table_};
  EXPECT_EQ(model_->Draft({&d, 1}, cache).status().code(), absl::StatusCode::kInvalidArgument);  // not kept
  d.hidden_row = 9;
  const std::vector<float> wrong(3, 0.0f);
  d.hidden = wrong;
  EXPECT_EQ(model_->Draft({&d, 1}, cache).status().code(), absl::StatusCode::kInvalidArgument);  // not a row
  std::vector<float> nan(static_cast<size_t>(model_->config().hidden_size), 0.0f);
  nan[3] = std::nanf("");
  d.hidden = nan;
  EXPECT_EQ(model_->Draft({&d, 1}, cache).status().code(), absl::StatusCode::kInvalidArgument);
  d.hidden = {};
  d.first_slot = 0;
  EXPECT_EQ(model_->Draft({&d, 1}, cache).status().code(), absl::StatusCode::kInvalidArgument);
  d.first_slot = 10;
  d.max_drafts = 300;  // past the block table
  EXPECT_EQ(model_->Draft({&d, 1}, cache).status().code(), absl::StatusCode::kInvalidArgument);

  LatentKvCache short_cache(layers_, kBlocks, model_->config().kv_entry_dim());
  EXPECT_EQ(model_->Forward({&s, 1}, short_cache).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::unique_ptr<DeepseekModel>> plain = DeepseekModel::Load(dir_);
  ASSERT_TRUE(plain.ok());
  LatentKvCache plain_cache = (*plain)->MakeKvCache(kBlocks);
  EXPECT_EQ((*plain)->Forward({&s, 1}, plain_cache).status().code(), absl::StatusCode::kFailedPrecondition);
  d.max_drafts = 1;
  EXPECT_EQ((*plain)->Draft({&d, 1}, plain_cache).status().code(), absl::StatusCode::kFailedPrecondition);

  // A checkpoint without an MTP layer cannot draft.
  nlohmann::json c = nlohmann::json::parse(PresetJson("tiny"));
  c["vocab_size"] = kVocab;
  c["num_nextn_predict_layers"] = 0;
  const std::string none = MakeModel(tmp_, "no-mtp", c.dump());
  EXPECT_EQ(DeepseekModel::Load(none, {.mtp = true}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
