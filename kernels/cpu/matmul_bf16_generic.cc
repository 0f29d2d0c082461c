// The portable bf16 row kernel: the order of kernels/cpu/matmul_bf16.h written out in
// scalar code (std::fma, so the compiler may not split or reorder it). It is also the
// reference the vector variants are tested against bit for bit.
#include <cmath>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/cpu/matmul_bf16.h"

namespace tandem::cpu {

void Bf16RowsGeneric(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  const int64_t k = p.w->cols, k8 = k / 8 * 8;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const std::byte* w = p.w->data + r * k * 2;
    for (int64_t t = 0; t < p.m; ++t) {
      const float* x = p.x + t * p.x_stride;
      float part[8] = {};
      for (int64_t i = 0; i < k8; i += 8) {
        for (int j = 0; j < 8; ++j) {
          uint16_t v;
          std::memcpy(&v, w + 2 * (i + j), 2);
          part[j] = std::fma(x[i + j], Bf16ToF32(v), part[j]);
        }
      }
      float s = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
      for (int64_t i = k8; i < k; ++i) {
        uint16_t v;
        std::memcpy(&v, w + 2 * i, 2);
        s = std::fma(x[i], Bf16ToF32(v), s);
      }
      float* y = p.y + t * p.y_stride + r;
      *y = p.accumulate ? *y + s : s;
    }
  }
}

}  // namespace tandem::cpu
