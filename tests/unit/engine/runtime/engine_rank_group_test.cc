// The engine over a rank group (engine/model/rank_group_backend.h): rank 0's scheduler
// broadcasts each step and forked ranks run it with the model's experts and/or dense parts
// split; concurrent requests with chunked prefills, a shared prefix and seeded sampling
// give exactly the one-rank engine's tokens. And the flags' combinations that do not run.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/rank_group_backend.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Drain;
using testing::Result;
using testing::Tokens;

std::vector<EngineRequest> Requests() {
  std::vector<EngineRequest> rs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt = Tokens(20 + 23 * i, 1 + i);
    if (i == 3) r.prompt = Tokens(40, 2);  // r1's first 40 tokens: a cached prefix, once r1 has run
    r.sampling.temperature = i == 2 ? 0.8f : 0.0f;  // r2 samples with a seed
    r.sampling.seed = 99;
    r.stop.max_tokens = 8;
    r.stop.ignore_eos = true;
    rs.push_back(std::move(r));
  }
  return rs;
}

// Every request's tokens, the first two submitted together and the others after them.
std::vector<std::vector<int32_t>> RunRequests(EngineOptions o) {
  o.num_threads = 1;
  o.max_batch_tokens = 32;  // prefills in chunks, mixed with decodes
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  std::vector<std::vector<int32_t>> out;
  std::vector<EngineRequest> rs = Requests();
  for (size_t first : {size_t{0}, size_t{2}}) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = first; i < first + 2; ++i) {
      absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(rs[i]);
      EXPECT_TRUE(s.ok()) << s.status();
      if (s.ok()) streams.push_back(*s);
    }
    for (auto& s : streams) {
      Result r = Drain(*s);
      EXPECT_TRUE(r.final.status.ok()) << r.final.status;
      out.push_back(r.tokens);
    }
  }
  return out;
}

class EngineRankGroupTest : public ::testing::Test {
 protected:
  // One rank's tokens, computed before any rank is forked (the engine's threads are gone
  // by then).
  static void SetUpTestSuite() { want_ = new std::vector<std::vector<int32_t>>(RunRequests({})); }
  static void TearDownTestSuite() { delete want_; }

  void ExpectRanksMatch(RankGroupOptions g) {
    ASSERT_EQ(want_->size(), 4u);
    static int counter = 0;
    g.name = "test-" + std::to_string(::getpid()) + "-engine-" + std::to_string(counter++);
    absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
        StartCpuRankGroup(testing::SmallTinyModelDir(), {.num_threads = 1}, g);
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_NE((*backend)->device_name().find("rank 0 of"), std::string::npos);
    auto holder = std::make_shared<std::unique_ptr<ModelBackend>>(std::move(*backend));
    EngineOptions o;
    o.backend_factory = [holder](const std::string&) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      return std::move(*holder);
    };
    EXPECT_EQ(RunRequests(o), *want_);
  }
  static std::vector<std::vector<int32_t>>* want_;
};
std::vector<std::vector<int32_t>>* EngineRankGroupTest::want_ = nullptr;

TEST_F(EngineRankGroupTest, ExpertParallelTwoRanks) { ExpectRanksMatch({.expert_parallel = 2}); }
TEST_F(EngineRankGroupTest, TensorParallelFourRanks) { ExpectRanksMatch({.tensor_parallel = 4}); }
TEST_F(EngineRankGroupTest, BothOnFourRanks) { ExpectRanksMatch({.expert_parallel = 4, .tensor_parallel = 4}); }
TEST_F(EngineRankGroupTest, ExpertParallelEightRanks) { ExpectRanksMatch({.expert_parallel = 8}); }

// This process's children (the ranks a group forked), from /proc.
std::vector<pid_t> Children() {
  std::vector<pid_t> pids;
  std::ifstream in("/proc/self/task/" + std::to_string(::getpid()) + "/children");
  for (pid_t p; in >> p;) pids.push_back(p);
  return pids;
}

// A rank that dies ends the requests of the step with an error, promptly, and the next
// request too: never a hang.
TEST(EngineRankGroupFailureTest, ADeadRankFailsRequestsWithoutHanging) {
  const std::string name = "test-" + std::to_string(::getpid()) + "-engine-dead";
  absl::StatusOr<std::unique_ptr<ModelBackend>> backend =
      StartCpuRankGroup(testing::SmallTinyModelDir(), {.num_threads = 1}, {.expert_parallel = 2, .name = name});
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::vector<pid_t> children = Children();
  ASSERT_EQ(children.size(), 1u);
  auto holder = std::make_shared<std::unique_ptr<ModelBackend>>(std::move(*backend));
  EngineOptions o;
  o.num_threads = 1;
  o.backend_factory = [holder](const std::string&) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
    return std::move(*holder);
  };
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(::kill(children[0], SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    EngineRequest r = Requests()[0];
    absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(r);
    ASSERT_TRUE(s.ok()) << s.status();
    const Result got = Drain(**s);
    EXPECT_FALSE(got.final.status.ok()) << i;
    EXPECT_TRUE(got.tokens.empty()) << i;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(RankGroupWorldTest, CombinationsThatDoNotRunSaySo) {
  const BackendOptions cpu;
  EXPECT_EQ(*RankGroupWorld({}, cpu), 1);
  EXPECT_EQ(*RankGroupWorld({.expert_parallel = 4}, cpu), 4);
  EXPECT_EQ(*RankGroupWorld({.expert_parallel = 2, .tensor_parallel = 2}, cpu), 2);
  EXPECT_EQ(RankGroupWorld({.expert_parallel = 0}, cpu).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankGroupWorld({.expert_parallel = 2, .tensor_parallel = 4}, cpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankGroupWorld({.expert_parallel = 100}, cpu).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankGroupWorld({.data_parallel = 2}, cpu).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(RankGroupWorld({.tensor_parallel = 2}, {.device = "cuda"}).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(RankGroupWorld({.tensor_parallel = 2}, {.mtp = true}).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace tandem
