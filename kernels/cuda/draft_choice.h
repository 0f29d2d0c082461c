// Speculative decoding's draft choice on the GPU (docs/speculative-decoding.md): for each
// row of the MTP layer's logits, the argmax (ties to the lowest index, as argmax.h and the
// CPU model's drafts) and its softmax probability at temperature 1, the draft's confidence:
// 1 / sum_v exp(logit_v - max), summed in double. NaN logits are skipped.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct DraftChoiceParams {
  const float* logits = nullptr;  // [rows][stride]
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t vocab = 0;
  int32_t* token = nullptr;       // [rows]
  float* confidence = nullptr;    // [rows]
};

cudaError_t DraftChoice(const DraftChoiceParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
