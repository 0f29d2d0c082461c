// A weight matrix as stored in a checkpoint: [rows, cols] row-major (torch Linear layout,
// rows = output features), in its stored element type. FP8 matrices carry one float
// scale per 128x128 block ("weight_scale_inv" in DeepSeek checkpoints): the real weight
// is fp8_value * scale[row / 128][col / 128].
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"

namespace tandem::cpu {

inline constexpr int64_t kFp8BlockSize = 128;

struct WeightMatrix {
  DType dtype = DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  const std::byte* data = nullptr;      // not necessarily aligned
  const float* block_scales = nullptr;  // FP8 only: [ceil(rows/128), ceil(cols/128)]
  // FP4 e2m1 checkpoints only (dtype is then the bf16 widening in `data`), where every scale
  // is a power of two (so the widening is exact): the stored codes ([rows][cols / 2], two a
  // byte, low nibble first) and their scales ([rows][cols / 32]), for devices that read FP4
  // directly. The CPU kernels ignore them.
  const uint8_t* fp4_codes = nullptr;
  const float* fp4_scales = nullptr;

  int64_t scale_cols() const { return (cols + kFp8BlockSize - 1) / kFp8BlockSize; }
  bool valid() const { return data != nullptr && rows > 0 && cols > 0; }
};

// Writes rows [row_begin, row_begin + num_rows) of `w` as float32 into out[num_rows][cols].
void DequantizeRows(const WeightMatrix& w, int64_t row_begin, int64_t num_rows, float* out);

}  // namespace tandem::cpu
