// DeepSeek-V4 through the engine on the CPU: requests batched together, their prompts
// prefilled in chunks that cut across windows and blocks, preempted and recomputed when
// the KV pool runs short, each give exactly the greedy continuation of the model run
// alone; what the engine cannot do for V4 yet (KV export and import) is refused clearly.
#include <map>

#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Drain;
using testing::Result;

const std::string& V4Dir() {
  static testing::TempDir* tmp = new testing::TempDir();
  static const std::string dir = v4::testing::MakeV4Model(*tmp, "tiny-v4", v4::testing::TinyV4Json(512).dump());
  return dir;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + salt * 7919 + (i * i) % 17) % 500;
  return t;
}

// The model alone: the prompt in one pass, then one token at a time, argmax each.
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

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

class EngineV4Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<v4::DeepseekV4Model>> m = v4::DeepseekV4Model::Load(V4Dir(), {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() { delete model_; }

  // Runs every prompt at once and checks each output against the model alone.
  void ExpectGreedyOutputs(EngineOptions o, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    o.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      absl::StatusOr<std::shared_ptr<OutputStream>> s =
          (*e)->Submit(Req("r" + std::to_string(i), prompts[i], max_tokens));
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
v4::DeepseekV4Model* EngineV4Test::model_ = nullptr;

TEST_F(EngineV4Test, BatchedChunkedRequestsGiveTheModelsGreedyContinuation) {
  // tiny-v4: a 16-token window, CSA windows of 4, HCA windows of 16; 40-token steps cut
  // every prompt's prefill across all of them and across 64-token blocks.
  ExpectGreedyOutputs({.max_batch_tokens = 40}, {Prompt(5, 1), Prompt(37, 2), Prompt(130, 3), Prompt(201, 4)}, 24);
  EXPECT_EQ(stats_.preemptions, 0);
}

TEST_F(EngineV4Test, PreemptedRequestsRecomputeExactly) {
  // Six blocks for four sequences that need two to four each: some are preempted, their
  // slots and blocks go to others, and they start again from their tokens.
  ExpectGreedyOutputs({.num_kv_blocks = 6, .max_batch_tokens = 64},
                      {Prompt(100, 5), Prompt(90, 6), Prompt(120, 7), Prompt(60, 8)}, 40);
  EXPECT_GT(stats_.preemptions, 0);
}

TEST_F(EngineV4Test, KvExportAndImportAreRefusedNamingTheModel) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), {.num_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->kv_entry_dim(), 0);
  EXPECT_EQ((*e)->kv_memory().base, nullptr);
  absl::StatusOr<std::vector<int32_t>> reserved = (*e)->ReserveKv("x", 10);
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(reserved.status().message().find("deepseek_v4"), std::string::npos) << reserved.status();
  EXPECT_EQ((*e)->config().model_type, "deepseek_v4");
  EXPECT_NE((*e)->config().summary.find("deepseek_v4"), std::string::npos) << (*e)->config().summary;
  EXPECT_EQ((*e)->kv_layout().streams.size(), 7u);
}

TEST_F(EngineV4Test, ACudaDeviceIsAClearError) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), {.device = "cuda"});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("DeepSeek-V4 runs on the CPU only"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace tandem
