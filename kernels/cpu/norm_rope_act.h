// Element-wise CPU kernels of the DeepSeek layers: RMSNorm, rotary embedding, SiLU gating.
#pragma once

#include <cstdint>

namespace tandem::cpu {

// out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for `rows` rows of `dim` values;
// out may alias x.
void RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* weight,
             float eps, float* out, int64_t out_stride);

// cos/sin of position * inv_freq[i] for the dim/2 rotary frequencies, times
// attention_factor (YaRN's magnitude correction; 1 without YaRN).
void RopeCosSin(int64_t position, const float* inv_freq, int64_t half_dim, float attention_factor,
                float* cos_out, float* sin_out);

// Rotates x[0..2*half_dim) in place. interleaved: pairs (x[2i], x[2i+1]) (DeepSeek's
// layout); otherwise pairs (x[i], x[i + half_dim]) (rotate_half layout).
void ApplyRope(float* x, const float* cos, const float* sin, int64_t half_dim, bool interleaved);

// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

// In-place softmax of x[0..n) (fp32, max-subtracted).
void SoftmaxInPlace(float* x, int64_t n);

}  // namespace tandem::cpu
