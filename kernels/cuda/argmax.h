// Greedy sampling on the GPU: out[r] = the index of the largest of logits[r][0 .. vocab),
// ties to the lowest index (as engine/runtime/sampler.h's greedy path). NaN never wins.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct ArgmaxParams {
  const float* logits = nullptr;  // [rows][stride]
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t vocab = 0;
  int32_t* out = nullptr;  // [rows]
};

cudaError_t Argmax(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
