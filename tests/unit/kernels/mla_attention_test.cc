#include "kernels/cpu/mla_attention.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

struct Dims {
  int64_t heads, nope, rope, v, lora;
  int64_t first_position, num_tokens;
  int64_t block_size;
};

struct Problem {
  Dims d;
  std::vector<float> q, pool, kv_b;
  std::vector<int32_t> block_table;
  WeightMatrix w;
  MlaAttentionParams params;
};

Problem Make(const Dims& d, unsigned seed) {
  Problem p;
  p.d = d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t keys = d.first_position + d.num_tokens;
  const int64_t entry = d.lora + d.rope;
  const int64_t blocks = (keys + d.block_size - 1) / d.block_size;
  // Blocks scattered in a larger pool, in reverse order, to exercise the block table.
  const int64_t pool_blocks = blocks * 2 + 1;
  p.pool.resize(static_cast<size_t>(pool_blocks * d.block_size * entry));
  for (float& v : p.pool) v = dist(rng);
  for (int64_t b = 0; b < blocks; ++b) p.block_table.push_back(static_cast<int32_t>(pool_blocks - 1 - 2 * b));
  p.q.resize(static_cast<size_t>(d.num_tokens * d.heads * (d.nope + d.rope)));
  for (float& v : p.q) v = dist(rng);
  p.kv_b.resize(static_cast<size_t>(d.heads * (d.nope + d.v) * d.lora));
  for (float& v : p.kv_b) v = dist(rng) / std::sqrt(static_cast<float>(d.lora));
  p.w = {.dtype = DType::kF32, .rows = d.heads * (d.nope + d.v), .cols = d.lora,
         .data = reinterpret_cast<const std::byte*>(p.kv_b.data())};
  p.params = {.num_heads = d.heads, .qk_nope_dim = d.nope, .qk_rope_dim = d.rope, .v_dim = d.v,
              .kv_lora_rank = d.lora, .softmax_scale = 1.0f / std::sqrt(static_cast<float>(d.nope + d.rope)),
              .q = p.q.data(), .q_stride = d.heads * (d.nope + d.rope), .num_tokens = d.num_tokens,
              .first_position = d.first_position,
              .cache = {.base = p.pool.data(), .block_table = p.block_table.data(), .block_size = d.block_size,
                        .entry_dim = entry},
              .kv_b = &p.w, .out = nullptr, .out_stride = d.heads * d.v};
  return p;
}

// Straight from the definition, in double: k = [W_uk c; k_rope], v = W_uv c.
std::vector<double> Reference(const Problem& p) {
  const Dims& d = p.d;
  std::vector<double> out(static_cast<size_t>(d.num_tokens * d.heads * d.v), 0.0);
  for (int64_t t = 0; t < d.num_tokens; ++t) {
    const int64_t visible = d.first_position + t + 1;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* q = &p.q[(t * d.heads + h) * (d.nope + d.rope)];
      std::vector<double> s(static_cast<size_t>(visible));
      for (int64_t j = 0; j < visible; ++j) {
        const float* e = p.params.cache.Entry(j);
        double dot = 0;
        for (int64_t i = 0; i < d.nope; ++i) {
          double k = 0;
          for (int64_t r = 0; r < d.lora; ++r) k += static_cast<double>(p.kv_b[(h * (d.nope + d.v) + i) * d.lora + r]) * e[r];
          dot += q[i] * k;
        }
        for (int64_t i = 0; i < d.rope; ++i) dot += static_cast<double>(q[d.nope + i]) * e[d.lora + i];
        s[j] = dot * p.params.softmax_scale;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += x = std::exp(x - m);
      for (int64_t j = 0; j < visible; ++j) {
        const float* e = p.params.cache.Entry(j);
        for (int64_t i = 0; i < d.v; ++i) {
          double val = 0;
          for (int64_t r = 0; r < d.lora; ++r) val += static_cast<double>(p.kv_b[(h * (d.nope + d.v) + d.nope + i) * d.lora + r]) * e[r];
          out[(t * d.heads + h) * d.v + i] += s[j] / sum * val;
        }
      }
    }
  }
  return out;
}

class MlaAttentionTest : public ::testing::TestWithParam<Dims> {};

TEST_P(MlaAttentionTest, ExpandedAndAbsorbedAgreeWithDefinition) {
  Problem p = Make(GetParam(), 7);
  const Dims& d = p.d;
  std::vector<float> expanded(static_cast<size_t>(d.num_tokens * d.heads * d.v));
  std::vector<float> absorbed(expanded.size());
  ThreadPool pool(3);
  MlaAttentionParams params = p.params;
  params.out = expanded.data();
  MlaAttentionExpanded(params, pool);
  params.out = absorbed.data();
  MlaAttentionAbsorbed(params, pool);
  const std::vector<double> ref = Reference(p);
  double max_ref = 0;
  for (double v : ref) max_ref = std::max(max_ref, std::fabs(v));
  for (size_t i = 0; i < ref.size(); ++i) {
    // Both forms within 1e-4 of the output scale of each other and of the definition.
    ASSERT_NEAR(expanded[i], absorbed[i], 1e-4 * max_ref) << i;
    ASSERT_NEAR(expanded[i], ref[i], 1e-4 * max_ref) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaAttentionTest,
                         ::testing::Values(Dims{4, 32, 16, 32, 64, 0, 1, 64},   // first decode step
                                           Dims{4, 32, 16, 32, 64, 0, 37, 64},  // prefill
                                           Dims{2, 16, 8, 24, 48, 130, 1, 64},  // decode over 3 blocks
                                           Dims{3, 16, 8, 16, 32, 70, 9, 16},   // chunk after a prefix
                                           Dims{1, 8, 4, 8, 16, 5, 3, 4}));

}  // namespace
}  // namespace tandem::cpu
