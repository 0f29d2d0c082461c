// The V4 per-token arithmetic against properties and double-precision evaluations of
// the formulas in shared/models/deepseek-v4.md §2 (Sinkhorn gives a doubly stochastic
// matrix, the inverse rotation undoes the forward one, softmax pooling and sink attention
// recomputed in double).
#include "engine/model/deepseek_v4/v4_math.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace tandem::v4 {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(V4MathTest, SinkhornGivesADoublyStochasticMix) {
  const int64_t n = 4;
  const std::vector<float> mix = Random((2 + n) * n, 1, 2.0f), base = Random((2 + n) * n, 2);
  const float scale[3] = {0.7f, 1.3f, 1.1f};
  std::vector<float> pre(n), post(n), comb(n * n);
  HyperConnectionMix(mix.data(), base.data(), scale, n, 20, 1e-6f, pre.data(), post.data(), comb.data());
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_GT(pre[j], 0.0f);
    EXPECT_LT(pre[j], 1.0f + 2e-6f);
    EXPECT_GT(post[j], 0.0f);
    EXPECT_LT(post[j], 2.0f);
    // pre = sigmoid(mix * s0 + base) + eps, post = 2 sigmoid(mix * s1 + base).
    EXPECT_NEAR(pre[j], 1.0 / (1.0 + std::exp(-(mix[j] * 0.7 + base[j]))) + 1e-6, 1e-6);
    EXPECT_NEAR(post[j], 2.0 / (1.0 + std::exp(-(mix[n + j] * 1.3 + base[n + j]))), 1e-6);
  }
  for (int64_t j = 0; j < n; ++j) {
    double row = 0, col = 0;
    for (int64_t k = 0; k < n; ++k) {
      row += comb[j * n + k];
      col += comb[k * n + j];
      EXPECT_GT(comb[j * n + k], 0.0f);
    }
    EXPECT_NEAR(row, 1.0, 1e-3) << j;
    EXPECT_NEAR(col, 1.0, 1e-5) << j;  // the last normalization is over columns
  }
  // One iteration: a row softmax (+eps), then one column normalization only.
  HyperConnectionMix(mix.data(), base.data(), scale, n, 1, 1e-6f, pre.data(), post.data(), comb.data());
  std::vector<double> soft(n * n);
  for (int64_t j = 0; j < n; ++j) {
    double m = -1e30, sum = 0;
    for (int64_t k = 0; k < n; ++k) m = std::max(m, double(mix[2 * n + j * n + k]) * 1.1 + base[2 * n + j * n + k]);
    for (int64_t k = 0; k < n; ++k) sum += std::exp(double(mix[2 * n + j * n + k]) * 1.1 + base[2 * n + j * n + k] - m);
    for (int64_t k = 0; k < n; ++k) {
      soft[j * n + k] = std::exp(double(mix[2 * n + j * n + k]) * 1.1 + base[2 * n + j * n + k] - m) / sum + 1e-6;
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    double col = 0;
    for (int64_t j = 0; j < n; ++j) col += soft[j * n + k];
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(comb[j * n + k], soft[j * n + k] / (col + 1e-6), 1e-6);
  }
}

TEST(V4MathTest, ExpandUsesCombTransposed) {
  // streams' = post_k f + sum_j comb[j][k] X_j: with comb = [[0, 1], [0, 0]] stream 1
  // receives stream 0, stream 0 receives nothing.
  const int64_t n = 2, d = 3;
  std::vector<float> x = {1, 2, 3, 10, 20, 30}, scratch(n * d);
  const float post[2] = {0.5f, 2.0f}, comb[4] = {0, 1, 0, 0}, f[3] = {1, 1, 1};
  ExpandStreams(x.data(), post, comb, f, n, d, scratch.data());
  EXPECT_EQ(x, (std::vector<float>{0.5f, 0.5f, 0.5f, 3, 4, 5}));
  float u[3];
  const float pre[2] = {1.0f, 0.25f};
  CollapseStreams(x.data(), pre, n, d, u);
  EXPECT_FLOAT_EQ(u[0], 0.5f + 0.75f);
}

TEST(V4MathTest, RopeRotatesTrailingInterleavedPairs) {
  RopeTable table;
  table.rope.theta = 10000.0;
  table.rotary_dim = 8;
  const Rope rope(table);
  const int64_t width = 32, pos = 37;
  std::vector<float> x = Random(width, 3), y = x;
  rope.Apply(y.data(), width, pos, false);
  for (int64_t i = 0; i < width - 8; ++i) EXPECT_EQ(y[i], x[i]);  // nope part untouched
  for (int64_t i = 0; i < 4; ++i) {
    const double inv = 1.0 / std::pow(10000.0, 2.0 * i / 8.0);
    const double a = x[24 + 2 * i], b = x[24 + 2 * i + 1], angle = pos * inv;
    EXPECT_NEAR(y[24 + 2 * i], a * std::cos(angle) - b * std::sin(angle), 1e-4);
    EXPECT_NEAR(y[24 + 2 * i + 1], b * std::cos(angle) + a * std::sin(angle), 1e-4);
  }
  rope.Apply(y.data(), width, pos, /*inverse=*/true);
  for (int64_t i = 0; i < width; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST(V4MathTest, PoolWindowIsAPerChannelSoftmaxAverage) {
  const int64_t slots = 6, width = 5;
  const std::vector<float> kv = Random(slots * width, 4), gate = Random(slots * width, 5, 3.0f);
  std::vector<const float*> k(slots), g(slots);
  for (int64_t s = 0; s < slots; ++s) {
    k[s] = &kv[s * width];
    g[s] = &gate[s * width];
  }
  std::vector<float> out(width);
  PoolWindow(k.data(), g.data(), slots, width, out.data());
  for (int64_t c = 0; c < width; ++c) {
    double sum = 0, acc = 0;
    for (int64_t s = 0; s < slots; ++s) sum += std::exp(double(gate[s * width + c]));
    for (int64_t s = 0; s < slots; ++s) acc += kv[s * width + c] * std::exp(double(gate[s * width + c])) / sum;
    EXPECT_NEAR(out[c], acc, 1e-5);
  }
}

TEST(V4MathTest, TopKBreaksTiesTowardsTheLowerIndex) {
  const float scores[6] = {0.5f, 2.0f, 0.5f, -1.0f, 2.0f, 0.5f};
  std::vector<int32_t> out;
  TopK(scores, 6, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 4}));
  TopK(scores, 6, 6, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(V4MathTest, AttentionWithASink) {
  const int64_t d = 8, n = 5;
  const std::vector<float> q = Random(d, 6), keys = Random(n * d, 7);
  std::vector<const float*> k(n);
  for (int64_t j = 0; j < n; ++j) k[j] = &keys[j * d];
  std::vector<float> scratch(n), out(d);
  const float scale = 0.35f, sink = 0.8f;
  AttendWithSink(q.data(), k.data(), n, d, scale, sink, scratch.data(), out.data());
  std::vector<double> logit(n);
  double denom = std::exp(double(sink));
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(q[i]) * keys[j * d + i];
    logit[j] = dot * scale;
    denom += std::exp(logit[j]);
  }
  for (int64_t i = 0; i < d; ++i) {
    double want = 0;
    for (int64_t j = 0; j < n; ++j) want += std::exp(logit[j]) / denom * keys[j * d + i];
    EXPECT_NEAR(out[i], want, 1e-5);
  }
  // A sink far above every logit takes all the weight.
  AttendWithSink(q.data(), k.data(), n, d, scale, 80.0f, scratch.data(), out.data());
  for (float v : out) EXPECT_NEAR(v, 0.0f, 1e-20);
}

TEST(V4MathTest, RouterScoresAndClampedSwiGlu) {
  float x[4] = {-3.0f, 0.0f, 2.5f, 30.0f};
  RouterScores(ScoringFunc::kSqrtSoftplus, x, 4);
  EXPECT_NEAR(x[0], std::sqrt(std::log1p(std::exp(-3.0))), 1e-6);
  EXPECT_NEAR(x[1], std::sqrt(std::log(2.0)), 1e-6);
  EXPECT_NEAR(x[2], std::sqrt(std::log1p(std::exp(2.5))), 1e-6);
  EXPECT_NEAR(x[3], std::sqrt(30.0), 1e-5);
  const float gate[3] = {-20.0f, 0.5f, 20.0f}, up[3] = {-20.0f, 0.5f, 20.0f};
  float h[3];
  ClampedSwiGlu(gate, up, 10.0f, 3, h);
  EXPECT_NEAR(h[0], -20.0 / (1 + std::exp(20.0)) * -10.0, 1e-9);  // the gate is clamped above only
  EXPECT_NEAR(h[1], 0.5 / (1 + std::exp(-0.5)) * 0.5, 1e-6);
  EXPECT_NEAR(h[2], 10.0 / (1 + std::exp(-10.0)) * 10.0, 1e-4);
  float u[3] = {3.0f, 4.0f, -1.0f};
  UnitRmsNorm(u, 3, 0.0f);
  EXPECT_NEAR(u[0] * u[0] + u[1] * u[1] + u[2] * u[2], 3.0, 1e-5);
}

}  // namespace
}  // namespace tandem::v4
