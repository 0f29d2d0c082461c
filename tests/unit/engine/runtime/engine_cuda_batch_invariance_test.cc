// --batch-invariant on the CUDA backend: as on the CPU (engine_batch_invariance_test.cc), a
// request's log-probabilities bitwise the same alone and among 1 to 255 random companions
// under any prefill chunking, greedy and seeded; and its seeded tokens sampled on the
// device likewise. Skips where no GPU is usable.
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/batch_invariance_support.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

std::unique_ptr<Engine> MakeCudaEngine(int32_t max_batch_tokens) {
  EngineOptions o;
  o.device = "cuda";
  o.num_threads = 2;
  o.gpu_memory_utilization = 0.3;
  o.batch_invariant = true;
  o.max_batch_tokens = max_batch_tokens;
  o.max_running = 256;
  o.num_kv_blocks = 2048;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class CudaBatchInvarianceTest : public testing::GpuTest {};

TEST_F(CudaBatchInvarianceTest, GreedyLogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant(MakeCudaEngine, /*seeded=*/false);
}

TEST_F(CudaBatchInvarianceTest, SeededLogprobsAreBitwiseTheSameAloneAndInAnyBatch) {
  testing::ExpectBatchInvariant(MakeCudaEngine, /*seeded=*/true);
}

// Without logprobs the tokens are chosen on the device (pipelined steps): the same tokens.
TEST_F(CudaBatchInvarianceTest, SeededTokensSampledOnTheDeviceAreTheSameInAnyBatch) {
  testing::ExpectBatchInvariant(MakeCudaEngine, /*seeded=*/true, /*logprobs=*/false);
}

}  // namespace
}  // namespace tandem
