// DeepSeek-V4 through the engine on the GPU (--device cuda): requests batched together,
// their prompts prefilled in chunks that cut across windows and blocks, preempted and
// recomputed when the KV pool runs short, give the greedy continuation of the CPU model
// run alone (both compute in float32: only the order of sums differs); what the GPU form
// cannot do yet (KV export and import) is refused, naming it. Skips, saying why, where no
// GPU is usable.
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
using testing::Prompt;
using testing::Result;
using testing::V4Dir;

std::vector<int32_t> Greedy(v4::DeepseekV4Model& m, const std::vector<int32_t>& prompt, int n) {
  v4::SequenceState state = m.NewSequence();
  absl::StatusOr<std::vector<float>> logits = m.Forward(prompt, state, /*all_logits=*/false);
  std::vector<int32_t> out;
  while (logits.ok() && static_cast<int>(out.size()) < n) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    out.push_back(t);
    logits = m.Forward({&t, 1}, state, false);
  }
  EXPECT_TRUE(logits.ok()) << logits.status();
  return out;
}

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
    return Engine::Create(V4Dir(), o);
  }

  void ExpectGreedyOutputs(EngineOptions o, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Make(o);
    ASSERT_TRUE(e.ok()) << e.status();
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      absl::StatusOr<std::shared_ptr<OutputStream>> s =
          (*e)->Submit(GreedyRequest("r" + std::to_string(i), prompts[i], max_tokens));
      ASSERT_TRUE(s.ok()) << s.status();
      streams.push_back(*s);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Result r = Drain(*streams[i]);
      ASSERT_TRUE(r.final.status.ok()) << r.final.status;
      EXPECT_EQ(r.tokens, Greedy(*model_, prompts[i], max_tokens)) << "prompt " << i << " (" << prompts[i].size()
                                                                    << " tokens)";
    }
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

TEST_F(EngineV4CudaTest, KvExportAndImportAreRefusedNamingThem) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Make({});
  ASSERT_TRUE(e.ok()) << e.status();
  absl::StatusOr<std::vector<int32_t>> r = (*e)->ReserveKv("x", 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("KV import into the cuda:0 pool"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace tandem
