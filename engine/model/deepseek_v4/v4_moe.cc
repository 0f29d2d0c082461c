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

// One expert over its rows: x [rows][D] in, y [rows][D] out.
struct ExpertRun {
  const ExpertWeights* w;
  const float* x;
  int64_t rows;
  float* y;
  std::vector<float> gate, up;
};

// The clamped SwiGLU experts in two fork-joins, every gate and up projection and then
// every down projection (cpu::MatmulBatch: the bits of one matmul at a time).
void Experts(std::vector<ExpertRun>& runs, int64_t hidden, float limit, bool round, cpu::ThreadPool& pool) {
  std::vector<cpu::MatmulParams> jobs;
  for (ExpertRun& r : runs) {
    const int64_t inter = r.w->gate.rows;
    r.gate.resize(static_cast<size_t>(r.rows * inter));
    r.up.resize(r.gate.size());
    jobs.push_back({.x = r.x, .m = r.rows, .x_stride = hidden, .w = &r.w->gate, .y = r.gate.data(), .y_stride = inter,
                    .round_fp8_input = round});
    jobs.push_back({.x = r.x, .m = r.rows, .x_stride = hidden, .w = &r.w->up, .y = r.up.data(), .y_stride = inter,
                    .round_fp8_input = round});
  }
  cpu::MatmulBatch(jobs, pool);
  jobs.clear();
  for (ExpertRun& r : runs) {
    const int64_t inter = r.w->gate.rows;
    ClampedSwiGlu(r.gate.data(), r.up.data(), limit, r.rows * inter, r.gate.data());
    jobs.push_back({.x = r.gate.data(), .m = r.rows, .x_stride = inter, .w = &r.w->down, .y = r.y, .y_stride = hidden,
                    .round_fp8_input = round});
  }
  cpu::MatmulBatch(jobs, pool);
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
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(e));
  for (int64_t i = 0; i < s * k; ++i) slots[chosen[i]].push_back(i);
  std::vector<std::vector<float>> gathered(static_cast<size_t>(e)), ys(static_cast<size_t>(e));
  std::vector<ExpertRun> runs;
  for (int64_t x = 0; x < e; ++x) {
    if (slots[x].empty()) continue;
    const int64_t n = static_cast<int64_t>(slots[x].size());
    gathered[x].resize(static_cast<size_t>(n * hidden));
    ys[x].resize(gathered[x].size());
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&gathered[x][r * hidden], p.x + (slots[x][r] / k) * hidden, hidden * sizeof(float));
    }
    runs.push_back({.w = &w.experts[x], .x = gathered[x].data(), .rows = n, .y = ys[x].data()});
  }
  runs.push_back({.w = &w.shared, .x = p.x, .rows = s, .y = p.out});
  Experts(runs, hidden, limit, p.round_fp8_input, pool);
  for (int64_t x = 0; x < e; ++x) {
    for (size_t r = 0; r < slots[x].size(); ++r) {
      std::memcpy(&routed[slots[x][r] * hidden], &ys[x][r * hidden], hidden * sizeof(float));
    }
  }

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
