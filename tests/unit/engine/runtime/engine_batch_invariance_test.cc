// --batch-invariant on the CPU (EngineOptions::batch_invariant): a request's log-probabilities
// are bitwise the same alone and among 1 to 255 random companions, whatever the step budget
// chunks its prompt into, greedy and seeded (batch_invariance_support.h).
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/batch_invariance_support.h"

namespace tandem {
namespace {

std::unique_ptr<Engine> MakeCpuEngine(int32_t max_batch_tokens) {
  EngineOptions o;
  o.num_threads = 2;
  o.batch_invariant = true;
  o.max_batch_tokens = max_batch_tokens;
  o.max_running = 256;
  o.num_kv_blocks = 2048;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class BatchInvarianceTest : public ::testing::TestWithParam<bool> {};

TEST_P(BatchInvarianceTest, LogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant(MakeCpuEngine, /*seeded=*/GetParam());
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, BatchInvarianceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Seeded" : "Greedy"; });

}  // namespace
}  // namespace tandem
