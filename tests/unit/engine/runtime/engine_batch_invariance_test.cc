// --batch-invariant on the CPU (EngineOptions::batch_invariant): a request's log-probabilities
// are bitwise the same alone and among 1 to 255 random companions, whatever the step budget
// chunks its prompt into, greedy and seeded (batch_invariance_support.h).
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/batch_invariance_support.h"

namespace tandem {
namespace {

class BatchInvarianceTest : public ::testing::TestWithParam<bool> {};

TEST_P(BatchInvarianceTest, LogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant("cpu", /*seeded=*/GetParam());
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSeeded, BatchInvarianceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Seeded" : "Greedy"; });

}  // namespace
}  // namespace tandem
