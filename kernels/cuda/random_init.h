// Fills device memory with the deterministic random weights engine/model/model_generator.cc
// writes into checkpoints (value i of a tensor depends only on its key = XXH64(name, seed)
// and i, from integer arithmetic and exact float operations), so that a benchmark can
// build a large random-weight model directly on the GPU, bit-identical to what
// `tandem make-model` would have written and the loader uploaded, without the checkpoint.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

enum class RandomInit {
  kLinear,     // normal / sqrt(fan_in)
  kEmbedding,  // normal
  kNorm,       // 1 + 0.25 * uniform[-1, 1)
  kBias,       // 0.1 * uniform[-1, 1)
};

struct RandomInitParams {
  uint64_t key = 0;
  int64_t n = 0;
  int64_t fan_in = 1;  // kLinear: the tensor's number of columns
  RandomInit init = RandomInit::kLinear;
  __nv_bfloat16* out_bf16 = nullptr;  // one of the two
  float* out_f32 = nullptr;
  bool round_to_bf16 = false;  // float output of a tensor stored in bf16
  // Each value times this before it is stored (rounded in float, as the generator's test
  // constructions scale drawn values: engine/model/mtp_test_model.h).
  float scale = 1.0f;
};

cudaError_t RandomInitFill(const RandomInitParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
