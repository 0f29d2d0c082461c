// DeepSeek-V4's expert selection on the GPU against the CPU engine's (v4::RouteToken):
// top-k of sqrt-softplus scores plus the correction bias, and hash routing by tid2eid,
// over V4-Flash's 256 experts top-6 and odd shapes. The GPU's expf/log1pf are within a few
// ulp of the host's, so a token whose k-th and (k+1)-th biased scores are that close may
// choose the other expert; such near-ties are skipped (and counted: they are rare).
// Skips, saying why, where no GPU is usable.
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_math.h"
#include "gtest/gtest.h"
#include "kernels/cuda/v4_moe_routing.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;

class CudaV4MoeRoutingTest : public testing::GpuTest {};

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<bool> near_tie;  // per token
};

Routed OnCpu(const v4::DeepseekV4Config& c, const std::vector<float>& logits, int64_t stride, int tokens,
             const std::vector<float>& bias, const std::vector<int32_t>* tid2eid, const std::vector<int32_t>* ids) {
  const int64_t e = c.n_routed_experts, k = c.num_experts_per_tok;
  Routed r;
  r.ids.resize(static_cast<size_t>(tokens * k));
  r.weights.resize(r.ids.size());
  r.near_tie.assign(static_cast<size_t>(tokens), false);
  std::vector<float> scores(static_cast<size_t>(e)), scratch(static_cast<size_t>(e));
  std::vector<int32_t> top;
  for (int t = 0; t < tokens; ++t) {
    std::copy(&logits[t * stride], &logits[t * stride] + e, scores.begin());
    const int32_t* row = tid2eid != nullptr ? &(*tid2eid)[static_cast<size_t>((*ids)[t] * k)] : nullptr;
    v4::RouteToken(c, scores.data(), bias.data(), row, scratch.data(), &top, &r.ids[t * k], &r.weights[t * k]);
    if (row == nullptr && k < e) {
      std::vector<float> sorted(scratch);
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      r.near_tie[static_cast<size_t>(t)] = sorted[k - 1] - sorted[k] < 1e-5f * std::fabs(sorted[k - 1]) + 1e-6f;
    }
  }
  return r;
}

TEST_F(CudaV4MoeRoutingTest, TopKMatchesTheCpu) {
  struct Shape {
    int experts, top_k, tokens;
  };
  for (const Shape s : {Shape{256, 6, 300}, Shape{8, 2, 17}, Shape{33, 1, 5}, Shape{1024, 32, 40}, Shape{64, 32, 3}}) {
    const std::string what = std::to_string(s.experts) + " experts, top " + std::to_string(s.top_k);
    v4::DeepseekV4Config c;
    c.n_routed_experts = s.experts;
    c.num_experts_per_tok = s.top_k;
    c.routed_scaling_factor = 1.5;
    const int64_t stride = s.experts + 3;
    std::mt19937 rng(s.experts * 7 + s.top_k);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(s.tokens * stride)), bias(static_cast<size_t>(s.experts));
    for (float& x : logits) x = d(rng);
    for (int t = 0; t < s.tokens; t += 7) logits[t * stride] = 25.0f + t;  // the linear branch
    for (float& x : bias) x = 0.1f * d(rng);
    const Routed want = OnCpu(c, logits, stride, s.tokens, bias, nullptr, nullptr);
    Dev<float> dlogits(logits), dbias(bias), dweights(want.weights.size());
    Dev<int32_t> dids(want.ids.size());
    ASSERT_EQ(cuda::V4MoeRouting({.logits = dlogits.get(), .logits_stride = stride, .num_tokens = s.tokens,
                                  .num_experts = s.experts, .top_k = s.top_k, .correction_bias = dbias.get(),
                                  .routed_scaling_factor = 1.5f, .expert_ids = dids.get(),
                                  .weights = dweights.get()},
                                 nullptr),
              cudaSuccess);
    const std::vector<int32_t> ids = dids.Download();
    const std::vector<float> weights = dweights.Download();
    int skipped = 0;
    for (int t = 0; t < s.tokens; ++t) {
      if (want.near_tie[static_cast<size_t>(t)]) {
        ++skipped;
        continue;
      }
      for (int j = 0; j < s.top_k; ++j) {
        const size_t i = static_cast<size_t>(t * s.top_k + j);
        ASSERT_EQ(ids[i], want.ids[i]) << what << ", token " << t << ", choice " << j;
        ASSERT_NEAR(weights[i], want.weights[i], 3e-6f * std::fabs(want.weights[i]) + 1e-9f)
            << what << ", token " << t << ", choice " << j;
      }
    }
    EXPECT_LE(skipped, s.tokens / 20) << what << ": too many near-ties to say much";
  }
}

TEST_F(CudaV4MoeRoutingTest, HashRoutingTakesTheTokensRowAndRefusesBadIds) {
  v4::DeepseekV4Config c;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 6;
  c.routed_scaling_factor = 1.5;
  const int tokens = 50, vocab = 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(tokens * 256)), bias(256, 0.0f);
  for (float& x : logits) x = d(rng);
  std::vector<int32_t> tid2eid(static_cast<size_t>(vocab * 6)), ids(tokens);
  for (int32_t& x : tid2eid) x = static_cast<int32_t>(rng() % 256);  // repeats allowed, any order
  for (int32_t& x : ids) x = static_cast<int32_t>(rng() % vocab);
  const Routed want = OnCpu(c, logits, 256, tokens, bias, &tid2eid, &ids);
  Dev<float> dlogits(logits), dweights(want.weights.size());
  Dev<int32_t> dtable(tid2eid), dtokens(ids), dids(want.ids.size()), dbad(std::vector<int32_t>{0});
  cuda::V4MoeRoutingParams p{.logits = dlogits.get(), .logits_stride = 256, .num_tokens = tokens,
                             .num_experts = 256, .top_k = 6, .tid2eid = dtable.get(), .tokens = dtokens.get(),
                             .vocab_size = vocab, .bad_input = dbad.get(), .routed_scaling_factor = 1.5f,
                             .expert_ids = dids.get(), .weights = dweights.get()};
  ASSERT_EQ(cuda::V4MoeRouting(p, nullptr), cudaSuccess);
  EXPECT_EQ(dids.Download(), want.ids);
  const std::vector<float> weights = dweights.Download();
  for (size_t i = 0; i < weights.size(); ++i) {
    ASSERT_NEAR(weights[i], want.weights[i], 3e-6f * std::fabs(want.weights[i]) + 1e-9f) << i;
  }
  EXPECT_EQ(dbad.Download()[0], 0);

  // A token past the vocabulary and an expert id past the experts: that token routes
  // nowhere and the flag says so; the others are untouched.
  ids[3] = vocab;
  tid2eid[static_cast<size_t>(ids[7] * 6 + 2)] = 256;
  dtokens.Upload(ids);
  dtable.Upload(tid2eid);
  ASSERT_EQ(cuda::V4MoeRouting(p, nullptr), cudaSuccess);
  const std::vector<int32_t> got = dids.Download();
  EXPECT_EQ(dbad.Download()[0], 1);
  for (int t : {3, 7}) {
    for (int j = 0; j < 6; ++j) EXPECT_EQ(got[static_cast<size_t>(t * 6 + j)], -1) << "token " << t;
  }
  for (int t = 0; t < tokens; ++t) {
    if (t == 3 || ids[t] == ids[7]) continue;
    for (int j = 0; j < 6; ++j) {
      ASSERT_EQ(got[static_cast<size_t>(t * 6 + j)], want.ids[static_cast<size_t>(t * 6 + j)]) << "token " << t;
    }
  }
}

TEST_F(CudaV4MoeRoutingTest, BadParamsAreRefused) {
  Dev<float> f(64);
  Dev<int32_t> i(64);
  EXPECT_EQ(cuda::V4MoeRouting({.logits = f.get(), .logits_stride = 8, .num_tokens = 1, .num_experts = 8,
                                .top_k = 2, .expert_ids = i.get(), .weights = f.get()},
                               nullptr),
            cudaErrorInvalidValue)
      << "top-k routing without a correction bias";
  EXPECT_EQ(cuda::V4MoeRouting({.logits = f.get(), .logits_stride = 8, .num_tokens = 1, .num_experts = 8,
                                .top_k = 9, .correction_bias = f.get(), .expert_ids = i.get(), .weights = f.get()},
                               nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::V4MoeRouting({.logits = f.get(), .logits_stride = 8, .num_tokens = 1, .num_experts = 8,
                                .top_k = 2, .tid2eid = i.get(), .expert_ids = i.get(), .weights = f.get()},
                               nullptr),
            cudaErrorInvalidValue)
      << "hash routing without the tokens";
}

}  // namespace
}  // namespace tandem
