// DeepSeek-V4's hyper-connection kernels against the CPU engine's arithmetic
// (engine/model/deepseek_v4/v4_math.h), over shapes around V4's (hc_mult 4, 20 Sinkhorn
// rounds, hidden 4096) and odd ones. The GPU's expf is within 2 ulp of the host's exp and
// the host may contract a*b+c into an FMA, so the weights agree to a few ulp, not bitwise.
// Skips, saying why, where no GPU is usable.
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "engine/model/deepseek_v4/v4_math.h"
#include "kernels/cuda/hyper_connections.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;
using testing::NormalValues;

class CudaHyperConnectionsTest : public testing::GpuTest {};

// |got - want| within `ulps` float32 ulps of max(|want|, floor).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float ulps, float floor,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const float tol = ulps * std::numeric_limits<float>::epsilon() * std::max(std::fabs(want[i]), floor);
    ASSERT_NEAR(got[i], want[i], tol) << what << " @" << i;
  }
}

TEST_F(CudaHyperConnectionsTest, MixMatchesTheCpuOverShapes) {
  for (int n : {1, 2, 4, 8}) {
    for (int iters : {1, 2, 20}) {
      for (int64_t tokens : {1, 5, 300}) {
        const int64_t width = 2 * n + n * n, stride = width + 3;
        const std::string what = "n " + std::to_string(n) + ", " + std::to_string(iters) + " rounds, " +
                                 std::to_string(tokens) + " tokens";
        const std::vector<float> mix = NormalValues(static_cast<size_t>(tokens * stride), 2.0f, n * 100 + iters);
        const std::vector<float> base = NormalValues(static_cast<size_t>(width), 1.0f, 7);
        const std::vector<float> scale = {0.7f, 1.3f, 0.9f};
        std::vector<float> pre(static_cast<size_t>(tokens * n)), post(pre.size()), comb(static_cast<size_t>(tokens * n * n));
        for (int64_t t = 0; t < tokens; ++t) {
          v4::HyperConnectionMix(&mix[t * stride], base.data(), scale.data(), n, iters, 1e-6f, &pre[t * n],
                                 &post[t * n], &comb[t * n * n]);
        }
        Dev<float> dmix(mix), dbase(base), dscale(scale), dpre(pre.size()), dpost(post.size()), dcomb(comb.size());
        ASSERT_EQ(cuda::HyperMix({.mix = dmix.get(), .mix_stride = stride, .base = dbase.get(), .scale = dscale.get(),
                                  .tokens = tokens, .n = n, .sinkhorn_iters = iters, .eps = 1e-6f,
                                  .pre = dpre.get(), .post = dpost.get(), .comb = dcomb.get()},
                                 nullptr),
                  cudaSuccess);
        ExpectClose(dpre.Download(), pre, 8, 1e-3f, what + ": pre");
        ExpectClose(dpost.Download(), post, 8, 1e-3f, what + ": post");
        // Sinkhorn's rounds compound the exp's ulps a little; 20 rounds stay within 64.
        ExpectClose(dcomb.Download(), comb, 64, 1e-3f, what + ": comb");
      }
    }
  }
}

TEST_F(CudaHyperConnectionsTest, HeadMixMatchesTheCpu) {
  const int n = 4;
  const int64_t tokens = 33;
  const std::vector<float> mix = NormalValues(static_cast<size_t>(tokens * n), 2.0f, 3), base = NormalValues(n, 1.0f, 4);
  const float scale = 0.8f;
  std::vector<float> pre(static_cast<size_t>(tokens * n));
  for (int64_t t = 0; t < tokens; ++t) v4::HyperHeadMix(&mix[t * n], base.data(), scale, n, 1e-6f, &pre[t * n]);
  Dev<float> dmix(mix), dbase(base), dscale(std::vector<float>{scale}), dpre(pre.size());
  ASSERT_EQ(cuda::HyperMix({.mix = dmix.get(), .mix_stride = n, .base = dbase.get(), .scale = dscale.get(),
                            .tokens = tokens, .n = n, .eps = 1e-6f, .head = true, .pre = dpre.get()},
                           nullptr),
            cudaSuccess);
  ExpectClose(dpre.Download(), pre, 8, 1e-3f, "head mix");
}

TEST_F(CudaHyperConnectionsTest, CollapseAndExpandMatchTheCpu) {
  for (int n : {1, 3, 4, 8}) {
    for (int64_t dim : {1, 7, 128, 4096}) {
      const int64_t tokens = dim >= 4096 ? 9 : 40, out_stride = dim + 5;
      const std::string what = "n " + std::to_string(n) + ", dim " + std::to_string(dim);
      const std::vector<float> streams = NormalValues(static_cast<size_t>(tokens * n * dim), 1.5f, n * 7 + 1);
      const std::vector<float> pre = NormalValues(static_cast<size_t>(tokens * n), 0.5f, 11);
      const std::vector<float> post = NormalValues(static_cast<size_t>(tokens * n), 0.5f, 12);
      const std::vector<float> comb = NormalValues(static_cast<size_t>(tokens * n * n), 0.3f, 13);
      const std::vector<float> f = NormalValues(static_cast<size_t>(tokens * out_stride), 1.0f, 14);
      std::vector<float> collapsed(static_cast<size_t>(tokens * out_stride), 0.0f), expanded = streams;
      std::vector<float> scratch(static_cast<size_t>(n * dim));
      for (int64_t t = 0; t < tokens; ++t) {
        v4::CollapseStreams(&streams[t * n * dim], &pre[t * n], n, dim, &collapsed[t * out_stride]);
        v4::ExpandStreams(&expanded[t * n * dim], &post[t * n], &comb[t * n * n], &f[t * out_stride], n, dim,
                          scratch.data());
      }
      Dev<float> dstreams(streams), dpre(pre), dpost(post), dcomb(comb), df(f), dout(collapsed.size());
      ASSERT_EQ(cudaMemset(dout.get(), 0, collapsed.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cuda::HyperCollapse({.streams = dstreams.get(), .pre = dpre.get(), .tokens = tokens, .n = n,
                                     .dim = dim, .out = dout.get(), .out_stride = out_stride},
                                    nullptr),
                cudaSuccess);
      ASSERT_EQ(cuda::HyperExpand({.streams = dstreams.get(), .post = dpost.get(), .comb = dcomb.get(),
                                   .f = df.get(), .f_stride = out_stride, .tokens = tokens, .n = n, .dim = dim},
                                  nullptr),
                cudaSuccess);
      // Sums of n products in the same order; only an FMA contraction on the host differs.
      ExpectClose(dout.Download(), collapsed, 4 * n, 1.0f, what + ": collapse");
      ExpectClose(dstreams.Download(), expanded, 4 * n, 1.0f, what + ": expand");
    }
  }
}

TEST_F(CudaHyperConnectionsTest, BadParamsAreRefused) {
  Dev<float> d(64);
  EXPECT_EQ(cuda::HyperMix({.mix = d.get(), .mix_stride = 24, .base = d.get(), .scale = d.get(), .tokens = 1,
                            .n = 9, .sinkhorn_iters = 1, .pre = d.get(), .post = d.get(), .comb = d.get()},
                           nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::HyperMix({.mix = d.get(), .mix_stride = 23, .base = d.get(), .scale = d.get(), .tokens = 1,
                            .n = 4, .sinkhorn_iters = 1, .pre = d.get(), .post = d.get(), .comb = d.get()},
                           nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::HyperCollapse({.streams = d.get(), .pre = d.get(), .tokens = 1, .n = 4, .dim = 8, .out = d.get(),
                                 .out_stride = 7},
                                nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::HyperExpand({.streams = d.get(), .post = d.get(), .comb = nullptr, .f = d.get(), .f_stride = 8,
                               .tokens = 1, .n = 4, .dim = 8},
                              nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
