// Structured output's mask on the GPU: before sampling, the logits of the tokens a row's
// grammar does not allow become -inf (the CPU's MaskLogits, engine/runtime/output_constraint.h).
// No allocation inside; one launch for all rows.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct TokenMaskParams {
  float* logits = nullptr;  // [rows][stride]
  int64_t stride = 0;
  int rows = 0;
  int vocab = 0;
  // Device [rows]: the row's mask among `masks`, or -1 for an unmasked row.
  const int32_t* row_slot = nullptr;
  // Device [slots][words]: bit i % 32 of word i / 32 allows token i; ids at or past
  // words * 32 are not allowed.
  const uint32_t* masks = nullptr;
  int words = 0;
};

cudaError_t ApplyTokenMasks(const TokenMaskParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
