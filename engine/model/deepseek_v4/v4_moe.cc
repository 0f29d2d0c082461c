#include "engine/model/deepseek_v4/v4_moe.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "engine/model/deepseek_v4/v4_math.h"
#include "kernels/common/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec.h"

namespace tandem::v4 {
namespace {

// The clamped SwiGLU of one expert over rows x [rows][D] into y [rows][D].
void Expert(const ExpertWeights& w, const float* x, int64_t rows, int64_t hidden, float limit, float* y,
            cpu::ThreadPool& pool) {
  const int64_t inter = w.gate.rows;
  std::vector<float> gate(static_cast<size_t>(rows * inter)), up(gate.size());
  cpu::Matmul({.x = x, .m = rows, .x_stride = hidden, .w = &w.gate, .y = gate.data(), .y_stride = inter}, pool);
  cpu::Matmul({.x = x, .m = rows, .x_stride = hidden, .w = &w.up, .y = up.data(), .y_stride = inter}, pool);
  ClampedSwiGlu(gate.data(), up.data(), limit, rows * inter, gate.data());
  cpu::Matmul({.x = gate.data(), .m = rows, .x_stride = inter, .w = &w.down, .y = y, .y_stride = hidden}, pool);
}

}  // namespace

void RunMoe(const MoeParams& p, cpu::ThreadPool& pool) {
  const DeepseekV4Config& c = *p.config;
  const MoeWeights& w = *p.weights;
  const int64_t s = p.rows, hidden = c.hidden_size, e = c.n_routed_experts, k = c.num_experts_per_tok;
  const float limit = static_cast<float>(c.swiglu_limit);

  // Routing: which experts, with which weights.
  std::vector<float> logits(static_cast<size_t>(s * e));
  cpu::Matmul({.x = p.x, .m = s, .x_stride = hidden, .w = &w.router, .y = logits.data(), .y_stride = e}, pool);
  std::vector<int32_t> chosen(static_cast<size_t>(s * k));
  std::vector<float> weight(static_cast<size_t>(s * k));
  std::vector<float> biased(static_cast<size_t>(e));
  std::vector<int32_t> top;
  for (int64_t t = 0; t < s; ++t) {
    const int32_t* hash_row = nullptr;
    if (p.type == MlpType::kHashMoe) {
      TANDEM_CHECK(p.tokens[t] >= 0 && p.tokens[t] < c.vocab_size) << p.tokens[t];
      hash_row = w.tid2eid + static_cast<int64_t>(p.tokens[t]) * k;
    }
    RouteToken(c, &logits[t * e], w.correction_bias, hash_row, biased.data(), &top, &chosen[t * k], &weight[t * k]);
  }

  // Each expert over the rows routed to it (a repeated expert in a tid2eid row counts
  // twice, as in transformers).
  std::vector<float> routed(static_cast<size_t>(s * k * hidden));
  std::vector<float> gathered, y;
  std::vector<int64_t> slots;
  for (int64_t x = 0; x < e; ++x) {
    slots.clear();
    for (int64_t i = 0; i < s * k; ++i) {
      if (chosen[i] == x) slots.push_back(i);
    }
    if (slots.empty()) continue;
    const int64_t n = static_cast<int64_t>(slots.size());
    gathered.resize(static_cast<size_t>(n * hidden));
    y.resize(gathered.size());
    for (int64_t r = 0; r < n; ++r) std::memcpy(&gathered[r * hidden], p.x + (slots[r] / k) * hidden, hidden * sizeof(float));
    Expert(w.experts[x], gathered.data(), n, hidden, limit, y.data(), pool);
    for (int64_t r = 0; r < n; ++r) std::memcpy(&routed[slots[r] * hidden], &y[r * hidden], hidden * sizeof(float));
  }

  Expert(w.shared, p.x, s, hidden, limit, p.out, pool);
  std::vector<int64_t> order(static_cast<size_t>(k));
  std::vector<float> acc(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < s; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return chosen[t * k + a] < chosen[t * k + b]; });
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j : order) cpu::Axpy(weight[t * k + j], &routed[(t * k + j) * hidden], acc.data(), hidden);
    float* out = p.out + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) out[i] = acc[i] + out[i];
  }
}

}  // namespace tandem::v4
