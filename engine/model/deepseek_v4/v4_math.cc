#include "engine/model/deepseek_v4/v4_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/common/check.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cpu/vec.h"

namespace tandem::v4 {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void UnitRmsNorm(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

Rope::Rope(const RopeTable& table)
    : inv_freq_(table.InverseFrequencies()),
      attention_factor_(static_cast<float>(table.AttentionFactor())),
      rotary_dim_(table.rotary_dim) {}

void Rope::Apply(float* x, int64_t width, int64_t position, bool inverse) const {
  const int64_t half = rotary_dim_ / 2;
  if (half == 0) return;
  TANDEM_CHECK(width >= rotary_dim_) << width << " < " << rotary_dim_;
  float cos[256], sin[256];
  TANDEM_CHECK(half <= 256) << "rotary_dim " << rotary_dim_;
  cpu::RopeCosSin(position, inv_freq_.data(), half, attention_factor_, cos, sin);
  if (inverse) {
    for (int64_t i = 0; i < half; ++i) sin[i] = -sin[i];
  }
  cpu::ApplyRope(x + width - rotary_dim_, cos, sin, half, /*interleaved=*/true);
}

void HyperConnectionMix(const float* mix, const float* base, const float* scale, int64_t n, int64_t sinkhorn_iters,
                            float hc_eps, float* pre, float* post, float* comb) {
  for (int64_t j = 0; j < n; ++j) {
    pre[j] = Sigmoid(mix[j] * scale[0] + base[j]) + hc_eps;
    post[j] = 2.0f * Sigmoid(mix[n + j] * scale[1] + base[n + j]);
  }
  // comb: a softmax over each row, then Sinkhorn-Knopp towards a doubly stochastic
  // matrix: columns first, then sinkhorn_iters - 1 rounds of rows and columns.
  for (int64_t j = 0; j < n; ++j) {
    float* row = comb + j * n;
    for (int64_t k = 0; k < n; ++k) row[k] = mix[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
    cpu::SoftmaxInPlace(row, n);
    for (int64_t k = 0; k < n; ++k) row[k] += hc_eps;
  }
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += comb[j * n + k];
      const float denom = sum + hc_eps;
      for (int64_t j = 0; j < n; ++j) comb[j * n + k] /= denom;
    }
  };
  normalize_columns();
  for (int64_t it = 1; it < sinkhorn_iters; ++it) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) sum += comb[j * n + k];
      const float denom = sum + hc_eps;
      for (int64_t k = 0; k < n; ++k) comb[j * n + k] /= denom;
    }
    normalize_columns();
  }
}

void HyperHeadMix(const float* mix, const float* base, float scale, int64_t n, float hc_eps, float* pre) {
  for (int64_t j = 0; j < n; ++j) pre[j] = Sigmoid(mix[j] * scale + base[j]) + hc_eps;
}

void CollapseStreams(const float* streams, const float* pre, int64_t n, int64_t d, float* u) {
  for (int64_t i = 0; i < d; ++i) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += pre[j] * streams[j * d + i];
    u[i] = sum;
  }
}

void ExpandStreams(float* streams, const float* post, const float* comb, const float* f, int64_t n, int64_t d,
                   float* scratch) {
  std::copy(streams, streams + n * d, scratch);
  for (int64_t k = 0; k < n; ++k) {
    float* out = streams + k * d;
    for (int64_t i = 0; i < d; ++i) {
      float mixed = 0.0f;
      for (int64_t j = 0; j < n; ++j) mixed += comb[j * n + k] * scratch[j * d + i];
      out[i] = post[k] * f[i] + mixed;
    }
  }
}

void RouterScores(ScoringFunc f, float* logits, int64_t n) {
  switch (f) {
    case ScoringFunc::kSqrtSoftplus:
      for (int64_t i = 0; i < n; ++i) {
        const float x = logits[i];
        // torch's softplus: linear above its threshold of 20.
        logits[i] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
      }
      return;
    case ScoringFunc::kSigmoid:
      for (int64_t i = 0; i < n; ++i) logits[i] = Sigmoid(logits[i]);
      return;
    case ScoringFunc::kSoftmax: cpu::SoftmaxInPlace(logits, n); return;
  }
}

void RouteToken(const DeepseekV4Config& c, float* scores, const float* correction_bias, const int32_t* hash_row,
                float* scratch, std::vector<int32_t>* top, int32_t* idx, float* weight) {
  const int64_t e = c.n_routed_experts, k = c.num_experts_per_tok;
  RouterScores(c.scoring_func, scores, e);
  if (hash_row != nullptr) {
    std::copy(hash_row, hash_row + k, idx);
  } else {
    for (int64_t x = 0; x < e; ++x) scratch[x] = scores[x] + correction_bias[x];
    TopK(scratch, e, k, top);
    std::copy(top->begin(), top->end(), idx);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += scores[idx[j]];
  for (int64_t j = 0; j < k; ++j) {
    weight[j] = scores[idx[j]] / (sum + 1e-20f) * static_cast<float>(c.routed_scaling_factor);
  }
}

void ClampedSwiGlu(const float* gate, const float* up, float limit, int64_t n, float* h) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    h[i] = g / (1.0f + std::exp(-g)) * u;
  }
}

void PoolWindow(const float* const* kv, const float* const* gate, int64_t slots, int64_t width, float* out) {
  for (int64_t c = 0; c < width; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < slots; ++s) m = std::max(m, gate[s][c]);
    float sum = 0.0f;
    for (int64_t s = 0; s < slots; ++s) sum += std::exp(gate[s][c] - m);
    float acc = 0.0f;  // exp again rather than a per-slot buffer: the same bits, any window size
    for (int64_t s = 0; s < slots; ++s) acc += kv[s][c] * (std::exp(gate[s][c] - m) / sum);
    out[c] = acc;
  }
}

void TopK(const float* scores, int64_t n, int64_t k, std::vector<int32_t>* out) {
  out->resize(static_cast<size_t>(n));
  std::iota(out->begin(), out->end(), 0);
  if (k < n) {
    std::nth_element(out->begin(), out->begin() + k, out->end(), [&](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    out->resize(static_cast<size_t>(k));
  }
  std::sort(out->begin(), out->end());
}

void AttendWithSink(const float* q, const float* const* keys, int64_t num_keys, int64_t d, float scale, float sink,
                    float* scratch, float* out) {
  float m = sink;
  for (int64_t j = 0; j < num_keys; ++j) {
    scratch[j] = cpu::Dot(q, keys[j], d) * scale;
    m = std::max(m, scratch[j]);
  }
  float sum = std::exp(sink - m);
  for (int64_t j = 0; j < num_keys; ++j) {
    scratch[j] = std::exp(scratch[j] - m);
    sum += scratch[j];
  }
  std::fill(out, out + d, 0.0f);
  for (int64_t j = 0; j < num_keys; ++j) cpu::Axpy(scratch[j] / sum, keys[j], out, d);
}

}  // namespace tandem::v4
