// The DeepSeek CPU model split over forked ranks (docs/parallel.md): expert parallelism
// (routed experts by id, all-to-all dispatch and combine), tensor parallelism (the LM
// head by vocabulary rows, dense MLPs by intermediate then output features) and
// data-parallel attention (each sequence on one rank, over that rank's own KV pool, the
// logits gathered to rank 0) give logits bitwise equal to one rank's, over a prefill with a
// chunked prompt and several greedy decode steps; under data parallelism each rank's pool
// holds exactly its own sequences' KV, bitwise one rank's; a rank loads only its part of
// the weights.
#include <array>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/data_parallel.h"
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

// Where each of the scenario's three sequences lives under data parallelism (dp_rank).
using Placement = std::array<int, 3>;
constexpr int kBlocksPerSeq = 2;
constexpr int kPoolBlocks = 3 * kBlocksPerSeq;

// Sequence i's blocks: [2 i, 2 i + 1] on one rank; under data parallelism the next two of
// its rank's pool, in sequence order (a rank's pool holds only its own sequences).
std::vector<int32_t> BlockTable(int i, const Placement& place, bool data_parallel) {
  int k = i;
  if (data_parallel) {
    k = 0;
    for (int j = 0; j < i; ++j) k += place[j] == place[i];
  }
  std::vector<int32_t> t(kBlocksPerSeq);
  std::iota(t.begin(), t.end(), k * kBlocksPerSeq);
  return t;
}

struct ScenarioRun {
  std::vector<std::vector<float>> logits;  // every Forward's, in order (rank 0's under data parallelism)
  std::vector<float> kv;                   // the rank's cache at the end
};

// Three sequences prefilled together, the second one's prompt in two chunks (the first
// chunk without logits, the second with every token's) next to the others' first decode
// steps, then greedy decode steps of all three in one batch. Under data parallelism
// (`group`), through ForwardDataParallel with each sequence on its rank of `place`, and
// rank 0's logits handed to every rank (as its next step plan would be). Empty logits on
// an error (printed).
ScenarioRun RunScenario(DeepseekModel& m, parallel::Collectives* group = nullptr, Placement place = {0, 0, 0}) {
  const bool dp = group != nullptr && m.layout().data_parallel;
  LatentKvCache cache = m.MakeKvCache(kPoolBlocks);
  const std::vector<int32_t> chunked = Prompt(13, 2);
  std::vector<std::vector<int32_t>> tables(3), tokens = {Prompt(7, 1), {chunked.begin(), chunked.begin() + 8},
                                                         Prompt(1, 3)};
  for (int i = 0; i < 3; ++i) tables[i] = BlockTable(i, place, dp);
  std::vector<int64_t> start(3, 0);
  ScenarioRun run;
  for (int step = 0; step <= kDecodeSteps + 1; ++step) {
    std::vector<ForwardSequence> batch;
    for (int i = 0; i < 3; ++i) {
      batch.push_back({.tokens = tokens[i], .start_position = start[i], .block_table = tables[i],
                       .all_logits = step == 1 && i == 1, .no_logits = step == 0 && i == 1,
                       .dp_rank = dp ? place[i] : 0});
    }
    absl::StatusOr<std::vector<float>> logits =
        dp ? ForwardDataParallel(*group, m, batch, cache) : m.Forward(batch, cache);
    int64_t rows = 0;
    for (const ForwardSequence& f : batch) rows += LogitRows(f);
    if (logits.ok() && dp) {
      logits->resize(static_cast<size_t>(rows * kVocab));
      absl::Status s = group->Broadcast(std::as_writable_bytes(std::span<float>(*logits)), /*root=*/0);
      if (!s.ok()) logits = s;
    }
    if (!logits.ok()) {
      std::fprintf(stderr, "Forward: %s\n", logits.status().ToString().c_str());
      return {};
    }
    // The last row of each sequence with logits picks its next token.
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
      start[i] += static_cast<int64_t>(tokens[i].size());
      row += LogitRows(batch[i]);
      if (LogitRows(batch[i]) == 0) tokens[i].assign(chunked.begin() + 8, chunked.end());
      else tokens[i] = {Argmax(&(*logits)[(row - 1) * kVocab])};
    }
    run.logits.push_back(std::move(*logits));
  }
  run.kv.assign(cache.data().begin(), cache.data().end());
  return run;
}

ScenarioRun OneRank(const std::string& dir) {
  // One thread: the test forks afterwards, and the pool is gone by then anyway.
  absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 1});
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  return RunScenario(**m);
}

struct Split {
  bool experts = false;
  bool dense = false;
  bool data = false;  // data-parallel attention, the sequences on the ranks of `place`
  Placement place = {0, 0, 0};
};

size_t Differing(std::span<const float> a, std::span<const float> b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Under data parallelism: rank `rank`'s pool (`got`, kPoolBlocks blocks per layer) holds
// its own sequences' KV in its first blocks, bitwise the one-rank cache's (`want`), and
// nothing else (every other block as it started, zero). Empty when so, else what differs.
std::string CheckRankPool(const ModelConfig& c, int rank, const Placement& place, std::span<const float> got,
                          std::span<const float> want) {
  const size_t block = static_cast<size_t>(kKvBlockSize * c.kv_entry_dim());
  const auto at = [&](int64_t layer, int32_t b) { return (layer * kPoolBlocks + b) * block; };
  std::vector<bool> own(kPoolBlocks, false);
  for (int i = 0; i < 3; ++i) {
    if (place[i] != rank) continue;
    const std::vector<int32_t> mine = BlockTable(i, place, true), one = BlockTable(i, place, false);
    for (int k = 0; k < kBlocksPerSeq; ++k) {
      own[mine[k]] = true;
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const size_t d = Differing(got.subspan(at(l, mine[k]), block), want.subspan(at(l, one[k]), block));
        if (d > 0) return absl::StrCat("sequence ", i, " layer ", l, " block ", k, ": ", d, " entries differ");
      }
    }
  }
  for (int32_t b = 0; b < kPoolBlocks; ++b) {
    for (int64_t l = 0; l < c.num_hidden_layers && !own[b]; ++l) {
      const std::span<const float> v = got.subspan(at(l, b), block);
      if (std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; })) {
        return absl::StrCat("block ", b, " of layer ", l, " holds no sequence of this rank, yet was written");
      }
    }
  }
  return "";
}

// Every rank of a `world`-rank group runs the scenario split as told; each exits 0 when
// its logits are bitwise `want`'s (and, under data parallelism, its pool holds its own
// sequences' KV bitwise).
void ExpectSplitMatches(const std::string& dir, int world, Split split, const ScenarioRun& want) {
  ASSERT_FALSE(want.logits.empty());
  ExpectAllOk(RunGroup(world, UniqueName("model"), [&](parallel::ShmCollectives& group) {
    DeepseekModel::LoadOptions o;
    o.num_threads = 1;
    o.group = &group;
    o.expert_parallel = split.experts;
    o.tensor_parallel = split.dense;
    o.data_parallel = split.data;
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, o);
    RANK_EXPECT(group.rank(), m.ok(), m.status().ToString());
    const ScenarioRun got = RunScenario(**m, &group, split.place);
    RANK_EXPECT(group.rank(), got.logits.size() == want.logits.size());
    for (size_t s = 0; s < got.logits.size(); ++s) {
      RANK_EXPECT(group.rank(), got.logits[s].size() == want.logits[s].size(), "step ", s);
      const size_t differ = Differing(got.logits[s], want.logits[s]);
      RANK_EXPECT(group.rank(), differ == 0, "step ", s, ": ", differ, " of ", got.logits[s].size(),
                  " logits differ from one rank's");
    }
    if (split.data) {
      const std::string pool = CheckRankPool((*m)->config(), group.rank(), split.place, got.kv, want.kv);
      RANK_EXPECT(group.rank(), pool.empty(), pool);
    }
    return 0;
  }));
}

class ParallelModelTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dir_ = new std::string(MakeModel(*tmp_, "tiny", WithVocab("tiny")));
    want_ = new ScenarioRun(OneRank(*dir_));
  }
  static void TearDownTestSuite() {
    delete want_;
    delete dir_;
    delete tmp_;
  }
  static TempDir* tmp_;
  static std::string* dir_;
  static ScenarioRun* want_;
};
TempDir* ParallelModelTest::tmp_ = nullptr;
std::string* ParallelModelTest::dir_ = nullptr;
ScenarioRun* ParallelModelTest::want_ = nullptr;

TEST_P(ParallelModelTest, ExpertParallelIsBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.experts = true}, *want_);
}

TEST_P(ParallelModelTest, TensorParallelIsBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.dense = true}, *want_);
}

TEST_P(ParallelModelTest, BothSplitsAreBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.experts = true, .dense = true}, *want_);
}

// The sequences on the last, first and middle ranks: on 4 and 8 ranks some have none, and
// on every count rank 0 has one (the chunked prompt) and gathers the others' logits.
Placement Spread(int world) { return {world - 1, 0, world / 2}; }

TEST_P(ParallelModelTest, DataParallelIsBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.data = true, .place = Spread(GetParam())}, *want_);
}

TEST_P(ParallelModelTest, DataAndExpertParallelAreBitwiseOneRank) {
  ExpectSplitMatches(*dir_, GetParam(), {.experts = true, .data = true, .place = Spread(GetParam())}, *want_);
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

// Data parallelism with every sequence on one rank (rank 0 and the others have no rows at
// all: they still take part in every exchange), and on 3 ranks with DeepSeek-V2's routing
// and 8 experts split unevenly.
TEST(ParallelModelVariantsTest, DataParallelPlacementsAreBitwiseOneRank) {
  TempDir tmp;
  const std::string dir = MakeModel(tmp, "tiny", WithVocab("tiny"));
  const ScenarioRun want = OneRank(dir);
  ExpectSplitMatches(dir, 2, {.experts = true, .data = true, .place = {1, 1, 1}}, want);
  ExpectSplitMatches(dir, 4, {.data = true, .place = {0, 0, 0}}, want);
  const std::string v2 = MakeModel(tmp, "v2", WithVocab("tiny-v2"), 11);
  ExpectSplitMatches(v2, 3, {.experts = true, .data = true, .place = {2, 1, 0}}, OneRank(v2));
}

// A step one rank refuses (a block id outside its pool) fails on every rank before any
// computes, with that rank's error there and the same code elsewhere, and the group goes
// on with the next step; a dp_rank outside the group is refused by all alike.
TEST(ParallelModelVariantsTest, ARankRefusingItsSequencesFailsTheStepEverywhere) {
  TempDir tmp;
  const std::string dir = MakeModel(tmp, "tiny", WithVocab("tiny"));
  ExpectAllOk(RunGroup(3, UniqueName("model"), [&](parallel::ShmCollectives& group) {
    DeepseekModel::LoadOptions o{.num_threads = 1, .group = &group, .expert_parallel = true, .data_parallel = true};
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, o);
    RANK_EXPECT(group.rank(), m.ok(), m.status().ToString());
    LatentKvCache cache = (*m)->MakeKvCache(2);
    const std::vector<int32_t> tokens = Prompt(5, 1), good = {0}, bad = {7};
    std::vector<ForwardSequence> batch = {{.tokens = tokens, .block_table = good, .dp_rank = 0},
                                          {.tokens = tokens, .block_table = bad, .dp_rank = 2}};
    absl::StatusOr<std::vector<float>> r = ForwardDataParallel(group, **m, batch, cache);
    RANK_EXPECT(group.rank(), r.status().code() == absl::StatusCode::kInvalidArgument, r.status().ToString());
    RANK_EXPECT(group.rank(), (group.rank() == 2) == absl::StrContains(r.status().message(), "out of range"),
                r.status().ToString());
    batch[1].dp_rank = 3;
    r = ForwardDataParallel(group, **m, batch, cache);
    RANK_EXPECT(group.rank(), r.status().code() == absl::StatusCode::kInvalidArgument, r.status().ToString());
    batch[1].block_table = good;
    batch[1].dp_rank = 2;
    r = ForwardDataParallel(group, **m, batch, cache);
    RANK_EXPECT(group.rank(), r.ok(), r.status().ToString());
    RANK_EXPECT(group.rank(), r->size() == static_cast<size_t>(group.rank() == 0 ? 2 * kVocab : 0));
    // Both sequences are the same tokens at the same positions: the same logits.
    if (group.rank() == 0) {
      const std::span<const float> all(*r);
      RANK_EXPECT(0, Differing(all.first(kVocab), all.subspan(kVocab)) == 0);
    }
    return 0;
  }));
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
  // Nor the dense parts under data parallelism; the whole of them is loaded there.
  o.mtp = false;
  o.data_parallel = true;
  EXPECT_EQ(DeepseekModel::Load(dir, o).status().code(), absl::StatusCode::kUnimplemented);
  o.tensor_parallel = false;
  absl::StatusOr<std::unique_ptr<DeepseekModel>> dp = DeepseekModel::Load(dir, o);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ((*dp)->weights().lm_head.rows, kVocab);
  EXPECT_TRUE((*dp)->layout().data_parallel);
}

}  // namespace
}  // namespace tandem
