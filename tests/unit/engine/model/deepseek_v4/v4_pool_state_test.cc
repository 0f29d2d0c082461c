// A V4 sequence's state through the paged pool: stored (at once or step by step, into
// scattered blocks and another sequence's slot beside it) and loaded back, it continues
// bit for bit as the state that never left memory, at every fill of the windows.
#include "engine/model/deepseek_v4/v4_pool_state.h"

#include <cstring>
#include <random>

#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/deepseek_v4/v4_model.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

class V4PoolStateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    absl::StatusOr<std::unique_ptr<DeepseekV4Model>> m =
        DeepseekV4Model::Load(MakeV4Model(*tmp_, "tiny-v4", TinyV4Json().dump()), {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tmp_;
  }

  static std::vector<int32_t> Tokens(int64_t n, uint32_t seed) { return testing::RandomTokens(n, seed); }
  static std::unique_ptr<KvPool> Pool() {
    const DeepseekV4Config& c = model_->config();
    absl::StatusOr<std::unique_ptr<KvPool>> p =
        KvPool::Create(KvStreamsFor(c), {.num_layers = static_cast<int32_t>(c.num_hidden_layers), .block_size = 64,
                                          .num_blocks = 12, .num_sequence_slots = 3});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  static TempDir* tmp_;
  static DeepseekV4Model* model_;
};
TempDir* V4PoolStateTest::tmp_ = nullptr;
DeepseekV4Model* V4PoolStateTest::model_ = nullptr;

void ExpectSameLogits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// Prefix lengths around every boundary tiny-v4 has (CSA windows of 4, HCA windows of 16,
// a 16-token sliding window, 64-token blocks).
TEST_F(V4PoolStateTest, AStoredAndLoadedStateContinuesBitForBit) {
  const std::vector<int32_t> prefix_lengths = {1, 3, 4, 5, 15, 16, 17, 63, 64, 65, 127, 128, 130, 200};
  const std::vector<int32_t> table = {7, 2, 10, 0};  // scattered, up to 256 tokens
  for (int32_t n : prefix_lengths) {
    SCOPED_TRACE(::testing::Message() << n << " tokens stored");
    const std::vector<int32_t> tokens = Tokens(n + 9, 100 + n);
    std::unique_ptr<KvPool> pool = Pool();
    ASSERT_NE(pool, nullptr);
    // Another sequence in slot 0 and blocks of its own, stored first: nothing of it leaks.
    SequenceState other = model_->NewSequence();
    ASSERT_TRUE(model_->Forward(Tokens(70, 3), other).ok());
    StoreState(model_->config(), other, 0, *pool, std::vector<int32_t>{1, 3}, 0);

    SequenceState original = model_->NewSequence();
    ASSERT_TRUE(model_->Forward(std::span(tokens).first(n), original).ok());
    StoreState(model_->config(), original, 0, *pool, table, 1);
    SequenceState loaded = model_->NewSequence();
    LoadState(model_->config(), *pool, table, 1, n, &loaded);

    absl::StatusOr<std::vector<float>> a = model_->Forward(std::span(tokens).subspan(n), original);
    absl::StatusOr<std::vector<float>> b = model_->Forward(std::span(tokens).subspan(n), loaded);
    ASSERT_TRUE(a.ok() && b.ok());
    ExpectSameLogits(*a, *b, "continuation");
  }
}

// As a paged backend will: every step stores what it added (entries of the windows it
// closed, the ring, the states) and the next step starts from what the pool holds.
TEST_F(V4PoolStateTest, StepByStepThroughThePoolEqualsOneState) {
  const std::vector<int32_t> tokens = Tokens(150, 9);
  const std::vector<int32_t> table = {5, 11, 1};
  std::unique_ptr<KvPool> pool = Pool();
  ASSERT_NE(pool, nullptr);
  SequenceState reference = model_->NewSequence();
  absl::StatusOr<std::vector<float>> want = model_->Forward(tokens, reference);
  ASSERT_TRUE(want.ok());
  std::vector<float> got;
  int64_t done = 0;
  for (int64_t chunk : {7, 1, 1, 13, 64, 1, 3, 60}) {
    SequenceState s = model_->NewSequence();
    LoadState(model_->config(), *pool, table, 2, done, &s);
    absl::StatusOr<std::vector<float>> l = model_->Forward(std::span(tokens).subspan(done, chunk), s);
    ASSERT_TRUE(l.ok());
    got.insert(got.end(), l->begin(), l->end());
    StoreState(model_->config(), s, done, *pool, table, 2);
    done += chunk;
  }
  ASSERT_EQ(done, 150);
  ExpectSameLogits(got, *want, "150 tokens in 8 chunks through the pool");
}

}  // namespace
}  // namespace tandem::v4
