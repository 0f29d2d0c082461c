// DeepSeek-V4 through the engine on the GPU (--device cuda): requests batched together,
// their prompts prefilled in chunks that cut across windows and blocks, preempted and
// recomputed when the KV pool runs short, give the greedy continuation of the CPU model
// run alone (both compute in float32: only the order of sums differs); a prompt's KV
// exported by a GPU prefill engine (copied from the GPU pool to the host pool) and
// imported by a GPU decode engine, or by a CPU one, continues the greedy run; a prefix-cache
// hit (snapshots copied within the GPU pool) gives the cold run's tokens. Skips, saying
// why, where no GPU is usable.
#include <algorithm>

#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/engine_v4_test_support.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Drain;
using testing::GreedyRequest;
using testing::ModelGreedy;
using testing::Prompt;
using testing::ReserveWithToken;
using testing::Result;
using testing::RunScored;
using testing::Scored;
using testing::StagingSink;
using testing::V4Dir;

class EngineV4CudaTest : public testing::GpuTest {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<v4::DeepseekV4Model>> m = v4::DeepseekV4Model::Load(V4Dir(), {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() { delete model_; }

  static absl::StatusOr<std::unique_ptr<Engine>> Make(EngineOptions o) {
    o.device = "cuda";
    o.num_threads = 2;
    o.gpu_memory_utilization = 0.3;
    if (o.num_kv_blocks == 0) o.num_kv_blocks = 256;
    return Engine::Create(V4Dir(), o);
  }

  void ExpectGreedyOutputs(EngineOptions o, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Make(o);
    ASSERT_TRUE(e.ok()) << e.status();
    testing::ExpectGreedyOutputs(**e, *model_, prompts, max_tokens);
    stats_ = (*e)->Stats();
  }

  static v4::DeepseekV4Model* model_;
  EngineStats stats_;
};
v4::DeepseekV4Model* EngineV4CudaTest::model_ = nullptr;

TEST_F(EngineV4CudaTest, BatchedChunkedRequestsGiveTheModelsGreedyContinuation) {
  ExpectGreedyOutputs({.max_batch_tokens = 40}, {Prompt(5, 1), Prompt(37, 2), Prompt(130, 3), Prompt(201, 4)}, 24);
  EXPECT_EQ(stats_.preemptions, 0);
}

TEST_F(EngineV4CudaTest, PreemptedRequestsRecomputeExactly) {
  ExpectGreedyOutputs({.num_kv_blocks = 6, .max_batch_tokens = 64},
                      {Prompt(100, 5), Prompt(90, 6), Prompt(120, 7), Prompt(60, 8)}, 40);
  EXPECT_GT(stats_.preemptions, 0);
}

TEST_F(EngineV4CudaTest, ExportedKvContinuesInAGpuOrCpuDecodeEngine) {
  absl::StatusOr<std::unique_ptr<Engine>> p = Make({.max_batch_tokens = 40});
  absl::StatusOr<std::unique_ptr<Engine>> gpu_decode = Make({});
  absl::StatusOr<std::unique_ptr<Engine>> cpu_decode = Engine::Create(V4Dir(), {.num_threads = 2});
  ASSERT_TRUE(p.ok() && gpu_decode.ok() && cpu_decode.ok());
  // A reservation first, so that the decode engines' blocks and slots differ from the prefill's.
  const KvLeases::Reservation shift = ReserveWithToken(**gpu_decode, "shift", 70);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, 11), Prompt(37, 12), Prompt(130, 13), Prompt(201, 14)};
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine& d = i % 2 == 0 ? **gpu_decode : **cpu_decode;
    SCOPED_TRACE(::testing::Message() << "prompt of " << prompts[i].size() << " tokens, decoded on "
                                      << (i % 2 == 0 ? "the GPU" : "the CPU"));
    const std::vector<int32_t> expected = ModelGreedy(*model_, prompts[i], 20);
    const std::string id = "q" + std::to_string(i);
    StagingSink sink;
    EngineRequest pre = GreedyRequest(id, prompts[i], 1);
    pre.kv_sink = &sink;
    absl::StatusOr<std::shared_ptr<OutputStream>> ps = (*p)->Submit(std::move(pre));
    ASSERT_TRUE(ps.ok()) << ps.status();
    const Result first = Drain(**ps);
    ASSERT_TRUE(first.final.status.ok()) << first.final.status;
    ASSERT_EQ(first.tokens.size(), 1u);
    EXPECT_EQ(first.tokens[0], expected[0]);
    EXPECT_EQ(sink.calls, 1);
    const KvLeases::Reservation r = ReserveWithToken(d, id, static_cast<int32_t>(prompts[i].size()));
    ASSERT_GE(r.state_slot, 0);
    sink.WriteInto(d, r);
    absl::StatusOr<std::shared_ptr<OutputStream>> ds = d.SubmitImported(GreedyRequest(id, prompts[i], 20), first.tokens[0]);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Result decoded = Drain(**ds);
    ASSERT_TRUE(decoded.final.status.ok()) << decoded.final.status;
    EXPECT_EQ(decoded.tokens, expected);
  }
  (*gpu_decode)->Cancel("shift");
}

TEST_F(EngineV4CudaTest, APrefixCacheHitGivesTheColdTokens) {
  const std::vector<int32_t> first = Prompt(150, 9);
  std::vector<int32_t> second = first;
  for (int32_t t : Prompt(50, 10)) second.push_back(t);
  absl::StatusOr<std::unique_ptr<Engine>> ref = Make({.enable_prefix_cache = false});
  absl::StatusOr<std::unique_ptr<Engine>> e = Make({});
  ASSERT_TRUE(ref.ok() && e.ok());
  const Scored want_second = RunScored(**ref, "ref2", second, 12);
  const Scored want_first = RunScored(**ref, "ref1", first, 12);
  const Scored a = RunScored(**e, "a", first, 12);
  const Scored b = RunScored(**e, "b", second, 12);
  const Scored c = RunScored(**e, "c", first, 12);
  EXPECT_EQ(a.metrics.cached_prompt_tokens, 0);
  EXPECT_EQ(b.metrics.cached_prompt_tokens, 128);
  EXPECT_EQ(c.metrics.cached_prompt_tokens, 128);
  EXPECT_EQ(a.tokens, want_first.tokens);
  EXPECT_EQ(b.tokens, want_second.tokens);
  EXPECT_EQ(c.tokens, want_first.tokens);
  // The GPU's sums may group differently in a shorter pass: logprobs agree closely, not bitwise.
  ASSERT_EQ(b.logprobs.size(), want_second.logprobs.size());
  for (size_t i = 0; i < b.logprobs.size(); ++i) EXPECT_NEAR(b.logprobs[i].first, want_second.logprobs[i].first, 1e-4) << i;
  EXPECT_EQ((*e)->Stats().prefix_state_snapshots, 2);
}

}  // namespace
}  // namespace tandem
