// The DeepSeek CPU model split over forked ranks (docs/parallel.md): expert parallelism
// (routed experts by id, all-to-all dispatch and combine) and tensor parallelism (the LM
// head by vocabulary rows, dense MLPs by intermediate then output features) give logits
// bitwise equal to one rank's, over a prefill and several greedy decode steps; a rank
// loads only its part of the weights.
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"
#include "tests/unit/engine/parallel/group_test_util.h"

namespace tandem {
namespace {

using parallel::testing::ExpectAllOk;
using parallel::testing::RunGroup;
using parallel::testing::UniqueName;
using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;

constexpr int64_t kVocab = 512;
constexpr int kDecodeSteps = 4;

std::string WithVocab(const std::string& preset) {
  nlohmann::json j = nlohmann::json::parse(PresetJson(preset));
  j["vocab_size"] = kVocab;
  return j.dump();
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 101 + 11) % (kVocab - 3) + 3;
  return p;
}

int32_t Argmax(const float* row) {
  return static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
}

// Three sequences prefilled together (one with every token's logits), then greedy decode
// steps of all three in one batch: every Forward's logits, in order. Empty on an error
// (printed).
std::vector<std::vector<float>> RunScenario(DeepseekModel& m) {
  constexpr int kBlocksPerSeq = 2;
  LatentKvCache cache = m.MakeKvCache(3 * kBlocksPerSeq);
  std::vector<std::vector<int32_t>> tables(3), tokens = {Prompt(7, 1), Prompt(13, 2), Prompt(1, 3)};
  for (int i = 0; i < 3; ++i) {
    tables[i].resize(kBlocksPerSeq);
    std::iota(tables[i].begin(), tables[i].end(), i * kBlocksPerSeq);
  }
  std::vector<int64_t> start(3, 0);
  std::vector<std::vector<float>> all;
  for (int step = 0; step <= kDecodeSteps; ++step) {
    std::vector<ForwardSequence> batch;
    for (int i = 0; i < 3; ++i) {
      batch.push_back({.tokens = tokens[i], .start_position = start[i], .block_table = tables[i],
                       .all_logits = step == 0 && i == 1});
    }
    absl::StatusOr<std::vector<float>> logits = m.Forward(batch, cache);
    if (!logits.ok()) {
      std::fprintf(stderr, "Forward: %s\n", logits.status().ToString().c_str());
      return {};
    }
    // The last row of each sequence picks its next token.
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      row += static_cast<int64_t>(batch[i].all_logits ? tokens[i].size() : 1);
      start[i] += static_cast<int64_t>(tokens[i].size());
      tokens[i] = {Argmax(&(*logits)[(row - 1) * kVocab])};
    }
    all.push_back(std::move(*logits));
  }
  return all;
}

std::vector<std::vector<float>> OneRank(const std::string& dir) {
  // One thread: the test forks afterwards, and the pool is gone by then anyway.
  absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 1});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  return RunScenario(**m);
}

struct Split {
  bool experts = false;
  bool dense = false;
};

// Every rank of a `world`-rank group runs the scenario split as told; each exits 0 when
// its logits are bitwise `want`.
void ExpectSplitMatches(const std::string& dir, int world, Split split,
                        const std::vector<std::vector<float>>& want) {
  ASSERT_FALSE(want.empty());
  ExpectAllOk(RunGroup(world, UniqueName("model"), [&](parallel::ShmCollectives& group) {
    DeepseekModel::LoadOptions o;
    o.num_threads = 1;
    o.group = &group;
    o.expert_parallel = split.experts;
    o.tensor_parallel = split.dense;
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, o);
    RANK_EXPECT(group.rank(), m.ok(), m.status().ToString());
    const std::vector<std::vector<float>> got = RunScenario(**m);
    RANK_EXPECT(group.rank(), got.size() == want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      RANK_EXPECT(group.rank(), got[s].size() == want[s].size(), "step ", s);
      size_t differ = 0;
      for (size_t i = 0; i < got[s].size(); ++i) {
        differ += std::memcmp(&got[s][i], &want[s][i], sizeof(float)) != 0;
      }
      RANK_EXPECT(group.rank(), differ == 0, "step ", s, ": ", differ, " of ", got[s].size(),
                  " logits differ from one rank's");
    }
    return 0;
  }));
}

class ParallelModelTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dir_ = new std::string(MakeModel(*tmp_, "tiny", WithVocab("tiny")));
    want_ = new std::vector<std::vector<float>>(OneRank(*dir_));
  }
  static void TearDownTestSuite() {
    delete want_;
    delete dir_;
    delete tmp_;
  }
  static TempDir* tmp_;
  static std::string* dir_;
  static std::vector<std::vector<float>>* want_;
};
TempDir* ParallelModelTest::tmp_ = nullptr;
std::string* ParallelModelTest::dir_ = nullptr;
std::vector<std::vector<float>>* ParallelModelTest::want_ = nullptr;

TEST_P(ParallelModelTest, ExpertParallelIsBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.experts = true}, *want_);
}

TEST_P(ParallelModelTest, TensorParallelIsBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.dense = true}, *want_);
}

TEST_P(ParallelModelTest, BothSplitsAreBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.experts = true, .dense = true}, *want_);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ParallelModelTest, ::testing::Values(2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// DeepSeek-V2's routing (softmax, group-limited greedy, no q LoRA); float32 weights over 3
// ranks, whose uneven row splits must fall on the matmul's 4-row blocks (its tail path
// rounds float32 rows differently); FP8 weights, whose splits follow the 128-row scale
// blocks. 3 ranks split 8 experts unevenly.
TEST(ParallelModelVariantsTest, V2AndF32AndFp8AndUnevenSplitsAreBitwiseOneRank) {
  TempDir tmp;
  const std::string v2 = MakeModel(tmp, "v2", WithVocab("tiny-v2"), 11);
  ExpectSplitMatches(v2, 3, {.experts = true, .dense = true}, OneRank(v2));
  const std::string f32 = MakeModel(tmp, "f32", WithVocab("tiny"), 3, DType::kF32);
  ExpectSplitMatches(f32, 3, {.experts = true, .dense = true}, OneRank(f32));
  const std::string fp8 = MakeModel(tmp, "fp8", WithVocab("tiny"), 5, DType::kF8E4M3);
  ExpectSplitMatches(fp8, 2, {.experts = true, .dense = true}, OneRank(fp8));
}

// A group that only answers rank() and world_size(): loading calls no collective.
class LayoutOnlyGroup : public parallel::Collectives {
 public:
  LayoutOnlyGroup(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  parallel::MemoryKind memory() const override { return parallel::MemoryKind::kHost; }
  absl::Status AllReduceSum(std::span<float>) override { return Unexpected(); }
  absl::Status AllGather(std::span<const std::byte>, std::span<std::byte>) override { return Unexpected(); }
  absl::Status AllToAll(std::span<const std::span<const std::byte>>, std::span<std::byte>,
                        std::span<size_t>) override {
    return Unexpected();
  }
  absl::Status Broadcast(std::span<std::byte>, int) override { return Unexpected(); }
  absl::Status Barrier() override { return Unexpected(); }

 private:
  static absl::Status Unexpected() { return absl::InternalError("no collective expected"); }
  int rank_, world_;
};

TEST(ParallelModelLoadTest, ARankLoadsOnlyItsExpertsAndRows) {
  TempDir tmp;
  const std::string dir = MakeModel(tmp, "tiny", WithVocab("tiny"));
  absl::StatusOr<std::unique_ptr<DeepseekModel>> whole = DeepseekModel::Load(dir, {.num_threads = 1});
  ASSERT_TRUE(whole.ok()) << whole.status();
  LayoutOnlyGroup group(/*rank=*/2, /*world=*/4);
  DeepseekModel::LoadOptions o{.num_threads = 1, .group = &group, .expert_parallel = true, .tensor_parallel = true};
  absl::StatusOr<std::unique_ptr<DeepseekModel>> part = DeepseekModel::Load(dir, o);
  ASSERT_TRUE(part.ok()) << part.status();
  const ModelWeights& w = (*part)->weights();
  EXPECT_TRUE(w.unused_tensors.empty()) << w.unused_tensors.front();
  for (const DecoderLayerWeights& l : w.layers) {
    if (l.moe) {
      for (int64_t e = 0; e < 8; ++e) {
        const bool local = e == 4 || e == 5;  // rank 2 of 4: experts [4, 6)
        EXPECT_EQ(l.moe->experts[e].gate.valid(), local) << e;
        EXPECT_EQ(l.moe->experts[e].down.valid(), local) << e;
      }
      EXPECT_TRUE(l.moe->shared->gate.valid());
    } else {
      EXPECT_EQ(l.mlp->gate.rows, 256 / 4);   // intermediate features [128, 192)
      EXPECT_EQ(l.mlp->down.rows, 128 / 4);   // output features [64, 96)
      EXPECT_EQ(l.mlp->inter_split.begin(2), 128);
    }
  }
  EXPECT_EQ(w.lm_head.rows, kVocab / 4);
  EXPECT_EQ(w.lm_head_split.begin(2), 2 * kVocab / 4);
  // Three quarters of the routed experts and of the split rows are not this rank's.
  EXPECT_LT(w.weight_bytes, (*whole)->weights().weight_bytes * 2 / 3);
  // Speculative decoding is not split yet.
  o.mtp = true;
  EXPECT_EQ(DeepseekModel::Load(dir, o).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
