// --batch-invariant on the CUDA backend: as on the CPU (engine_batch_invariance_test.cc), a
// request's log-probabilities bitwise the same alone and among 1 to 255 random companions
// under any prefill chunking, greedy and seeded; and its seeded tokens sampled on the
// device likewise. Skips where no GPU is usable.
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/batch_invariance_support.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

class CudaBatchInvarianceTest : public testing::GpuTest {};

TEST_F(CudaBatchInvarianceTest, GreedyLogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant("cuda", /*seeded=*/false);
}

TEST_F(CudaBatchInvarianceTest, SeededLogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant("cuda", /*seeded=*/true);
}

// Without logprobs the tokens are chosen on the device (pipelined steps): the same tokens.
TEST_F(CudaBatchInvarianceTest, SeededTokensSampledOnTheDeviceAreTheSameInAnyBatch) {
  testing::ExpectBatchInvariant("cuda", /*seeded=*/true, /*logprobs=*/false);
}

}  // namespace
}  // namespace tandem
