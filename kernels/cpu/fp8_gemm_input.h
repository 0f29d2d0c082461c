// Activations as a block-scaled FP8 GEMM on the GPU reads them (kernels/cuda/fp8_gemm.h:
// Fp8QuantizeRows, DeepSeek's act_quant): per row and 128 columns, scale = max(amax, 1e-4)
// / 448 and each value e4m3(x / scale) * scale. A CPU reference given this rounding differs
// from the GPU's FP8 products only by the order and precision of their sums.
#pragma once

#include <cstdint>

namespace tandem::cpu {

// out [rows][k] from x [rows][stride]; bf16_first: each value rounded to bf16 before (a GPU
// path whose activations are bf16).
void RoundAsFp8GemmInput(const float* x, int64_t rows, int64_t stride, int64_t k, bool bf16_first, float* out);

}  // namespace tandem::cpu
