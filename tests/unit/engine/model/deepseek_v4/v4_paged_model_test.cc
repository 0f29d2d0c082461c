// DeepSeek-V4 over the paged pool, batched: sequences prefilled in chunks next to others
// decoding, in scattered blocks and reused slots, give bitwise the logits of the full
// pass over each sequence alone; bad batches are refused before anything is written.
#include "engine/model/deepseek_v4/v4_paged_model.h"

#include <cstring>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

constexpr int64_t kVocab = 512;

std::vector<int32_t> Tokens(int64_t n, uint32_t seed) { return testing::RandomTokens(n, seed, kVocab); }

class PagedV4ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dir_ = new std::string(MakeV4Model(*tmp_, "tiny-v4", TinyV4Json(kVocab).dump()));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete tmp_;
  }
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<PagedV4Model>> m = PagedV4Model::Load(*dir_, {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    absl::StatusOr<std::unique_ptr<DeepseekV4Model>> r = DeepseekV4Model::Load(*dir_, {.num_threads = 2});
    ASSERT_TRUE(r.ok()) << r.status();
    reference_ = std::move(*r);
    absl::StatusOr<std::unique_ptr<KvPool>> p = KvPool::Create(
        model_->kv_streams(), {.num_layers = static_cast<int32_t>(model_->config().num_hidden_layers),
                               .block_size = 64, .num_blocks = 16, .num_sequence_slots = 3});
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
  }
  // The full pass's logits row of `position` of `tokens`.
  std::vector<float> Row(const std::vector<int32_t>& tokens, int64_t position) {
    auto it = full_.find(tokens);
    if (it == full_.end()) it = full_.emplace(tokens, *reference_->ForwardFull(tokens)).first;
    return {it->second.begin() + position * kVocab, it->second.begin() + (position + 1) * kVocab};
  }

  static TempDir* tmp_;
  static std::string* dir_;
  std::unique_ptr<PagedV4Model> model_;
  std::unique_ptr<DeepseekV4Model> reference_;
  std::unique_ptr<KvPool> pool_;
  std::map<std::vector<int32_t>, std::vector<float>> full_;
};
TempDir* PagedV4ModelTest::tmp_ = nullptr;
std::string* PagedV4ModelTest::dir_ = nullptr;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t slot;
  int64_t done = 0;
};

TEST_F(PagedV4ModelTest, BatchedChunksAndDecodeStepsGiveTheFullPassBitwise) {
  std::vector<Seq> seqs = {{Tokens(150, 1), {9, 2, 14}, 2}, {Tokens(52, 2), {0}, 0}, {Tokens(100, 3), {5, 11}, 1}};
  // Per step, per sequence: how many new tokens (0: not in this step), and whether all rows.
  const std::vector<std::vector<std::pair<int64_t, bool>>> plan = {
      {{70, false}, {40, true}, {0, false}},  // A: a chunk without logits (no_logits below)
      {{80, false}, {1, true}, {30, true}},   // A: its last token's row; B decodes; C starts
      {{0, false}, {1, false}, {60, true}},
      {{0, false}, {10, true}, {10, false}},
  };
  for (size_t step = 0; step < plan.size(); ++step) {
    std::vector<ForwardSequence> batch;
    std::vector<std::pair<size_t, int64_t>> rows;  // sequence, position
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [n, all] = plan[step][i];
      if (n == 0) continue;
      Seq& s = seqs[i];
      ForwardSequence q{.tokens = std::span(s.tokens).subspan(s.done, n), .start_position = s.done,
                        .block_table = s.blocks, .all_logits = all, .state_slot = s.slot};
      q.no_logits = step == 0 && i == 0;
      batch.push_back(q);
      if (q.no_logits) {
      } else if (all) {
        for (int64_t p = s.done; p < s.done + n; ++p) rows.push_back({i, p});
      } else {
        rows.push_back({i, s.done + n - 1});
      }
      s.done += n;
    }
    int layers_seen = 0;
    absl::StatusOr<std::vector<float>> logits =
        model_->Forward(batch, *pool_, {.after_layer_kv = [&](int64_t) { ++layers_seen; }});
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(layers_seen, model_->config().num_hidden_layers);
    ASSERT_EQ(logits->size(), rows.size() * kVocab) << "step " << step;
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [i, p] = rows[r];
      // The full pass is over the whole sequence: its rows do not depend on later tokens.
      const std::vector<float> want = Row(seqs[i].tokens, p);
      EXPECT_EQ(std::memcmp(logits->data() + r * kVocab, want.data(), kVocab * sizeof(float)), 0)
          << "step " << step << ", sequence " << i << ", position " << p;
    }
  }

  // A new sequence in A's slot and blocks starts afresh.
  const std::vector<int32_t> d = Tokens(20, 4);
  const std::vector<ForwardSequence> fresh = {
      {.tokens = d, .start_position = 0, .block_table = seqs[0].blocks, .all_logits = true, .state_slot = 2}};
  absl::StatusOr<std::vector<float>> logits = model_->Forward(fresh, *pool_);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const std::vector<float> want = *reference_->ForwardFull(d);
  EXPECT_EQ(std::memcmp(logits->data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST_F(PagedV4ModelTest, ABadBatchIsRefusedBeforeAnythingIsWritten) {
  const std::vector<int32_t> a = Tokens(70, 5), bad_token = {1, static_cast<int32_t>(kVocab)};
  const std::vector<int32_t> one_block = {3}, two_blocks = {3, 4};
  const std::vector<uint8_t> before(reinterpret_cast<const uint8_t*>(pool_->memory().data()),
                                    reinterpret_cast<const uint8_t*>(pool_->memory().data()) + pool_->memory().size());
  auto expect_refused = [&](const ForwardSequence& second, const std::string& says) {
    const std::vector<ForwardSequence> batch = {
        {.tokens = a, .start_position = 0, .block_table = two_blocks, .state_slot = 0}, second};
    absl::StatusOr<std::vector<float>> r = model_->Forward(batch, *pool_);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status();
    EXPECT_EQ(std::memcmp(pool_->memory().data(), before.data(), before.size()), 0) << says;
  };
  expect_refused({.tokens = bad_token, .block_table = one_block, .state_slot = 1},
                 "sequence 1 of the batch: token 512");
  expect_refused({.tokens = a, .block_table = one_block, .state_slot = 1}, "1 blocks do not cover 70 positions");
  expect_refused({.tokens = a, .block_table = two_blocks}, "state slot -1");
  expect_refused({.tokens = a, .block_table = two_blocks, .state_slot = 3}, "state slot 3");
  expect_refused({.tokens = {}, .block_table = two_blocks, .state_slot = 1}, "no tokens");
  const std::vector<int32_t> outside = {3, 16};
  expect_refused({.tokens = a, .block_table = outside, .state_slot = 1}, "block 16 outside the pool");

  // A pool of another model's streams.
  std::vector<KvStream> other = model_->kv_streams();
  other[0].tokens *= 2;
  std::unique_ptr<KvPool> wrong = *KvPool::Create(other, pool_->geometry());
  const std::vector<ForwardSequence> batch = {
      {.tokens = a, .start_position = 0, .block_table = two_blocks, .state_slot = 0}};
  EXPECT_EQ(model_->Forward(batch, *wrong).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::v4
