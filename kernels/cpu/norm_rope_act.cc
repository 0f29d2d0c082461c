#include "kernels/cpu/norm_rope_act.h"

#include <algorithm>
#include <cmath>

namespace tandem::cpu {

void RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* weight,
             float eps, float* out, int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = out + r * out_stride;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float variance = static_cast<float>(sum / static_cast<double>(dim));
    const float inv = 1.0f / std::sqrt(variance + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void RopeCosSin(int64_t position, const float* inv_freq, int64_t half_dim, float attention_factor,
                float* cos_out, float* sin_out) {
  const float pos = static_cast<float>(position);
  for (int64_t i = 0; i < half_dim; ++i) {
    const float angle = pos * inv_freq[i];
    cos_out[i] = std::cos(angle) * attention_factor;
    sin_out[i] = std::sin(angle) * attention_factor;
  }
}

void ApplyRope(float* x, const float* cos, const float* sin, int64_t half_dim, bool interleaved) {
  for (int64_t i = 0; i < half_dim; ++i) {
    float* a = interleaved ? x + 2 * i : x + i;
    float* b = interleaved ? x + 2 * i + 1 : x + i + half_dim;
    const float x0 = *a, x1 = *b;
    *a = x0 * cos[i] - x1 * sin[i];
    *b = x1 * cos[i] + x0 * sin[i];
  }
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void SoftmaxInPlace(float* x, int64_t n) {
  if (n <= 0) return;
  const float m = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace tandem::cpu
