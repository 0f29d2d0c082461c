#include "kernels/cpu/fp8_gemm_input.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/dtype.h"

namespace tandem::cpu {

void RoundAsFp8GemmInput(const float* x, int64_t rows, int64_t stride, int64_t k, bool bf16_first, float* out) {
  constexpr int64_t kBlock = 128;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < k; b += kBlock) {
      const int64_t end = std::min(k, b + kBlock);
      float amax = 0.0f;
      for (int64_t c = b; c < end; ++c) {
        const float v = x[r * stride + c];
        out[r * k + c] = bf16_first ? Bf16ToF32(F32ToBf16(v)) : v;
        amax = std::max(amax, std::fabs(out[r * k + c]));
      }
      const float scale = std::max(amax, 1e-4f) / 448.0f;
      for (int64_t c = b; c < end; ++c) out[r * k + c] = F8E4M3ToF32(F32ToF8E4M3(out[r * k + c] / scale)) * scale;
    }
  }
}

}  // namespace tandem::cpu
