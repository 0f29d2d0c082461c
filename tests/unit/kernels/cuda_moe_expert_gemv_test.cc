// MoeExpertGemv (kernels/cuda/moe_expert_gemv.h) against a float64 CPU reference over a
// grid of MoE shapes (DeepSeek-V2-Lite's among them), 1 to 4 tokens (1 to 4 rows per
// expert: every token's first expert is the same one, the shared experts take every
// token), with and without split activations; the routing and permutation come from
// MoePermute, as in the model. Skips, saying why, where no GPU is usable.
//
// Tolerances: each product is a float32 sum over k of float32 activations (bf16 value +
// bf16 remainder) times bf16 weights; its error is far below 2e-5 of the sum of
// |products| (float32 accumulation over k <= 4096 in 8-term partial sums). The SiLU-and-mul
// output carries the errors of gate and up through silu'(gate) <= 1.1 and up, plus its
// own rounding: one bf16 rounding (2^-8 relative) without a remainder output, ~2^-16
// with one (2^-14 allowed). The scatter-add adds float32 roundings of the running sums
// (at most top_k + shared adds per element, in any order).
#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch_control.h"
#include "kernels/cuda/moe_expert_gemv.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/random_init.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;
using testing::DevEvent;

__nv_bfloat16* Bf(const Dev<uint16_t>& d) { return reinterpret_cast<__nv_bfloat16*>(d.get()); }

struct Shape {
  const char* name;
  int hidden, inter, experts, shared, top_k;
};

// DeepSeek-V2-Lite; the `tiny` and `tiny-v2` test models; two passes over k for gate_up
// (k = 2560) and for down (k = 2304), no shared expert; widths that are not powers of two.
constexpr Shape kShapes[] = {{"V2-Lite", 2048, 1408, 64, 2, 6}, {"tiny", 128, 64, 8, 1, 2},
                             {"tiny-v2", 128, 64, 8, 2, 2},     {"k 2560", 2560, 96, 16, 1, 4},
                             {"down k 2304", 256, 2304, 8, 0, 3}, {"odd", 144, 40, 5, 2, 2}};

// Routing of `tokens` tokens: top_k distinct experts each, the first the same for every
// token (a routed group with one row per token), the others random; weights in (0.1, 1).
void Route(int tokens, const Shape& s, uint32_t seed, std::vector<int32_t>* ids, std::vector<float>* weights) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, s.experts - 1);
  std::uniform_real_distribution<float> w(0.1f, 1.0f);
  ids->assign(static_cast<size_t>(tokens) * s.top_k, 0);
  weights->assign(ids->size(), 0.0f);
  for (int t = 0; t < tokens; ++t) {
    int32_t* row = &(*ids)[t * s.top_k];
    for (int k = 0; k < s.top_k;) {
      const int e = k == 0 ? 5 % s.experts : pick(rng);
      if (std::find(row, row + k, e) != row + k) continue;
      row[k] = e;
      (*weights)[t * s.top_k + k] = w(rng);
      ++k;
    }
  }
}

// The routing's permutation on the GPU (MoePermute), with host copies.
struct Permutation {
  Permutation(const std::vector<int32_t>& ids, const std::vector<float>& weights, int tokens, const Shape& s,
              int tile_rows = 0)
      : groups(s.experts + s.shared),
        rows(tokens * (s.top_k + s.shared)),
        d_ids(ids),
        d_weights(weights),
        d_offsets(groups + 1),
        d_active(groups),
        d_num(1),
        d_token(rows),
        d_weight(rows),
        d_entry(rows),
        d_tile_group(cuda::MoeMaxTiles(rows, groups, 16)),
        d_tile_row(cuda::MoeMaxTiles(rows, groups, 16)),
        d_num_tiles(1) {
    params = {.expert_ids = d_ids.get(), .weights = d_weights.get(), .num_tokens = tokens, .top_k = s.top_k,
              .num_experts = s.experts, .num_shared = s.shared, .group_offsets = d_offsets.get(),
              .active_groups = d_active.get(), .num_active = d_num.get(), .sorted_token = d_token.get(),
              .sorted_weight = d_weight.get(), .entry_row = d_entry.get(), .tile_rows = tile_rows,
              .tile_group = d_tile_group.get(), .tile_row = d_tile_row.get(), .num_tiles = d_num_tiles.get()};
    EXPECT_EQ(cuda::MoePermute(params, nullptr), cudaSuccess);
    offsets = d_offsets.Download();
    token = d_token.Download();
    weight = d_weight.Download();
  }
  int groups, rows;
  Dev<int32_t> d_ids;
  Dev<float> d_weights;
  Dev<int32_t> d_offsets, d_active, d_num;
  Dev<int32_t> d_token;
  Dev<float> d_weight;
  Dev<int32_t> d_entry, d_tile_group, d_tile_row, d_num_tiles;
  cuda::MoePermuteParams params;
  std::vector<int32_t> offsets, token;
  std::vector<float> weight;
};

// Random bf16 weights generated on the GPU ([groups][rows][cols], normal / sqrt(cols)).
void FillWeights(const Dev<uint16_t>& w, int64_t cols, uint64_t key) {
  ASSERT_EQ(cuda::RandomInitFill({.key = key, .n = static_cast<int64_t>(w.size()), .fan_in = cols,
                                  .init = cuda::RandomInit::kLinear, .out_bf16 = Bf(w)},
                                 nullptr),
            cudaSuccess);
}

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

class CudaMoeExpertGemvTest : public testing::GpuTest {};

TEST_F(CudaMoeExpertGemvTest, MatchesFloat64) {
  for (const Shape& s : kShapes) {
    const int H = s.hidden, I = s.inter, groups = s.experts + s.shared;
    Dev<uint16_t> w1(static_cast<size_t>(groups) * 2 * I * H), w2(static_cast<size_t>(groups) * H * I);
    FillWeights(w1, H, 1000 + H);
    FillWeights(w2, I, 2000 + I);
    const std::vector<uint16_t> hw1 = w1.Download(), hw2 = w2.Download();
    for (int tokens = 1; tokens <= cuda::kMoeExpertGemvMaxRows; ++tokens) {
      for (const bool split : {true, false}) {
        const std::string what = std::string(s.name) + ", " + std::to_string(tokens) + " tokens" +
                                 (split ? ", split activations" : ", bf16 activations");
        std::vector<int32_t> ids;
        std::vector<float> route_weights;
        Route(tokens, s, tokens * 17 + H, &ids, &route_weights);
        const Permutation perm(ids, route_weights, tokens, s);
        const int rows = perm.rows;
        const int max_active = std::min(groups, tokens * s.top_k + s.shared);

        // Activations: bf16 value and remainder of float32 rows.
        std::mt19937 rng(tokens + H);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<uint16_t> hi(static_cast<size_t>(tokens) * H), lo(hi.size());
        std::vector<double> x(hi.size());
        for (size_t i = 0; i < hi.size(); ++i) {
          const float v = normal(rng);
          hi[i] = F32ToBf16(v);
          lo[i] = F32ToBf16(v - Bf16ToF32(hi[i]));
          x[i] = Bf16ToF32(hi[i]) + (split ? static_cast<double>(Bf16ToF32(lo[i])) : 0.0);
        }
        // gate_up as the model runs it (the token rows staged once, a_row_count), and with
        // each expert's rows staged through a_rows: the same products, bit for bit.
        Dev<uint16_t> d_hi(hi), d_lo(lo), act(static_cast<size_t>(rows) * I), act_lo(act.size());
        Dev<uint16_t> act2(act.size()), act2_lo(act.size());
        for (const bool stage_tokens : {true, false}) {
          ASSERT_EQ(cuda::MoeExpertGemv({.a = Bf(d_hi), .a_lo = split ? Bf(d_lo) : nullptr, .lda = H,
                                         .a_rows = perm.d_token.get(), .a_row_count = stage_tokens ? tokens : 0,
                                         .b = Bf(w1), .b_group_stride = static_cast<int64_t>(2) * I * H, .n = 2 * I,
                                         .k = H, .group_offsets = perm.d_offsets.get(),
                                         .active_groups = perm.d_active.get(), .num_active = perm.d_num.get(),
                                         .num_groups = groups, .num_static = s.shared, .max_active = max_active,
                                         .max_rows = tokens, .epilogue = cuda::GemmEpilogue::kSiluMulBf16,
                                         .out = stage_tokens ? act.get() : act2.get(), .ldo = I,
                                         .out_lo = split ? Bf(stage_tokens ? act_lo : act2_lo) : nullptr},
                                        nullptr),
                    cudaSuccess)
              << what;
        }
        const std::vector<uint16_t> got_hi = act.Download(), got_lo = act_lo.Download();
        ASSERT_EQ(got_hi, act2.Download()) << what;
        if (split) {
          ASSERT_EQ(got_lo, act2_lo.Download()) << what;
        }
        std::vector<double> a(static_cast<size_t>(rows) * I);  // the GPU's activations, for the down check
        for (int g = 0; g < groups; ++g) {
          for (int p = perm.offsets[g]; p < perm.offsets[g + 1]; ++p) {
            const double* xr = &x[static_cast<size_t>(perm.token[p]) * H];
            for (int i = 0; i < I; ++i) {
              const size_t gate_row = (static_cast<size_t>(g) * 2 * I + (i / 8) * 16 + i % 8) * H;
              double gate = 0, up = 0, gate_mag = 0, up_mag = 0;
              for (int k = 0; k < H; ++k) {
                const double pg = xr[k] * Bf16ToF32(hw1[gate_row + k]);
                const double pu = xr[k] * Bf16ToF32(hw1[gate_row + 8 * H + k]);
                gate += pg;
                up += pu;
                gate_mag += std::fabs(pg);
                up_mag += std::fabs(pu);
              }
              const double want = Silu(gate) * up;
              const size_t at = static_cast<size_t>(p) * I + i;
              const double got = Bf16ToF32(got_hi[at]) + (split ? static_cast<double>(Bf16ToF32(got_lo[at])) : 0.0);
              a[at] = got;
              const double tol =
                  2e-5 * (1.1 * gate_mag * std::fabs(up) + up_mag * std::fabs(Silu(gate))) +
                  (split ? 0x1p-14 : 0x1p-8) * std::fabs(want) + 1e-30;
              ASSERT_NEAR(got, want, tol) << what << ": gate_up row " << p << " (group " << g << ") column " << i;
            }
          }
        }

        // Down projection from the GPU's activations, scatter-added into token rows: each
        // group's rows staged when its first tile comes, and every group's rows staged once
        // up front (staged_rows, as the model runs it).
        std::vector<float> base(static_cast<size_t>(tokens) * H);
        for (float& v : base) v = normal(rng);
        std::vector<double> want(base.begin(), base.end()), mag(base.size());
        for (size_t i = 0; i < base.size(); ++i) mag[i] = std::fabs(base[i]);
        for (int g = 0; g < groups; ++g) {
          for (int p = perm.offsets[g]; p < perm.offsets[g + 1]; ++p) {
            for (int c = 0; c < H; ++c) {
              const size_t w_row = (static_cast<size_t>(g) * H + c) * I;
              double sum = 0, sum_mag = 0;
              for (int k = 0; k < I; ++k) {
                const double prod = a[static_cast<size_t>(p) * I + k] * Bf16ToF32(hw2[w_row + k]);
                sum += prod;
                sum_mag += std::fabs(prod);
              }
              const size_t at = static_cast<size_t>(perm.token[p]) * H + c;
              want[at] += perm.weight[p] * sum;
              mag[at] += perm.weight[p] * sum_mag;
            }
          }
        }
        // Then with the sums in a fixed order (partial + tile counters), twice: the same bits.
        Dev<float> partial(static_cast<size_t>(rows) * H);
        Dev<uint32_t> counters(std::vector<uint32_t>(H / 16, 0u));
        std::vector<float> ordered;
        for (int mode = 0; mode < 4; ++mode) {
          const bool stage_all = mode >= 1, in_order = mode >= 2;
          Dev<float> out(base);
          ASSERT_EQ(cuda::MoeExpertGemv({.a = Bf(act), .a_lo = split ? Bf(act_lo) : nullptr, .lda = I,
                                         .staged_rows = stage_all ? rows : 0, .b = Bf(w2),
                                         .b_group_stride = static_cast<int64_t>(H) * I, .n = H, .k = I,
                                         .group_offsets = perm.d_offsets.get(), .active_groups = perm.d_active.get(),
                                         .num_active = perm.d_num.get(), .num_groups = groups,
                                         .num_static = s.shared, .max_active = max_active, .max_rows = tokens,
                                         .epilogue = cuda::GemmEpilogue::kScatterAddF32, .out = out.get(), .ldo = H,
                                         .out_rows = perm.d_token.get(), .row_scale = perm.d_weight.get(),
                                         .partial = in_order ? partial.get() : nullptr,
                                         .tile_counters = counters.get(), .out_row_count = tokens},
                                        nullptr),
                    cudaSuccess)
              << what;
          const std::vector<float> got = out.Download();
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-5 * mag[i] + 1e-30)
                << what << (stage_all ? ", all rows staged" : "") << (in_order ? ", in order" : "")
                << ": down, token " << i / H << " column " << i % H;
          }
          if (mode == 2) ordered = got;
          if (mode == 3) {
            EXPECT_EQ(got, ordered) << what << ": the ordered sums differ between two runs";
            EXPECT_EQ(counters.Download(), std::vector<uint32_t>(H / 16, 0u)) << what;
          }
        }
      }
    }
  }
}

// `tokens` tokens routed by Route (seed route_seed) over the shape's experts, their bf16
// rows drawn from rng: what a scatter-add or SiLU launch over staged token rows reads.
struct RoutedTokens {
  RoutedTokens(const Shape& s, int tokens, uint32_t route_seed, std::mt19937& rng)
      : tokens(tokens), perm(Routed(s, tokens, route_seed)), x(static_cast<size_t>(tokens) * s.hidden) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& v : x) v = F32ToBf16(normal(rng));
    dx = std::make_unique<Dev<uint16_t>>(x);
  }
  static Permutation Routed(const Shape& s, int tokens, uint32_t seed) {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    Route(tokens, s, seed, &ids, &weights);
    return Permutation(ids, weights, tokens, s);
  }
  // MoeExpertGemv's params over these rows with `weights`' b / b_fp8 / b_row_scales and
  // b_group_stride (n = N, k = hidden).
  cuda::MoeExpertGemvParams Params(const Shape& s, int N, cuda::MoeExpertGemvParams weights) const {
    const int groups = s.experts + s.shared;
    weights.a = Bf(*dx);
    weights.lda = s.hidden;
    weights.a_rows = perm.d_token.get();
    weights.a_row_count = tokens;
    weights.n = N;
    weights.k = s.hidden;
    weights.group_offsets = perm.d_offsets.get();
    weights.active_groups = perm.d_active.get();
    weights.num_active = perm.d_num.get();
    weights.num_groups = groups;
    weights.num_static = s.shared;
    weights.max_active = std::min(groups, tokens * s.top_k + s.shared);
    weights.max_rows = tokens;
    return weights;
  }
  int tokens;
  Permutation perm;
  std::vector<uint16_t> x;
  std::unique_ptr<Dev<uint16_t>> dx;
};

// The scatter-add epilogue (scaled by the routing weights, into token rows holding base
// values drawn from rng) against float64: weight(row, k) is the exact value of row `row`
// (group * N + column) of the weights.
template <typename Weight>
void ExpectScatterAddMatches(const Shape& s, int N, const RoutedTokens& rt, cuda::MoeExpertGemvParams weights,
                             std::mt19937& rng, Weight weight) {
  const int H = s.hidden, groups = s.experts + s.shared;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> base(static_cast<size_t>(rt.tokens) * N);
  for (float& v : base) v = normal(rng);
  Dev<float> out(base);
  cuda::MoeExpertGemvParams p = rt.Params(s, N, weights);
  p.epilogue = cuda::GemmEpilogue::kScatterAddF32;
  p.out = out.get();
  p.ldo = N;
  p.out_rows = rt.perm.d_token.get();
  p.row_scale = rt.perm.d_weight.get();
  ASSERT_EQ(cuda::MoeExpertGemv(p, nullptr), cudaSuccess);
  const std::vector<float> got = out.Download();
  std::vector<double> want(base.begin(), base.end()), mag(base.size());
  for (size_t i = 0; i < base.size(); ++i) mag[i] = std::fabs(base[i]);
  for (int g = 0; g < groups; ++g) {
    for (int q = rt.perm.offsets[g]; q < rt.perm.offsets[g + 1]; ++q) {
      const int t = rt.perm.token[q];
      for (int c = 0; c < N; ++c) {
        const size_t row = static_cast<size_t>(g) * N + c;
        double sum = 0, sum_mag = 0;
        for (int k = 0; k < H; ++k) {
          const double prod = static_cast<double>(Bf16ToF32(rt.x[static_cast<size_t>(t) * H + k])) * weight(row, k);
          sum += prod;
          sum_mag += std::fabs(prod);
        }
        want[t * N + c] += rt.perm.weight[q] * sum;
        mag[t * N + c] += rt.perm.weight[q] * sum_mag;
      }
    }
  }
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5 * mag[i] + 1e-30) << s.name << ", " << rt.tokens << " tokens @" << i;
  }
}

TEST_F(CudaMoeExpertGemvTest, ScatterAddFromStagedTokenRows) {
  // The scatter-add epilogue with the token rows staged once (a_row_count): each expert's
  // product with the tokens routed to it, scaled and added into the token rows.
  for (const Shape& s : {kShapes[1], kShapes[2], kShapes[5]}) {
    const int H = s.hidden, N = 48, groups = s.experts + s.shared;
    Dev<uint16_t> w(static_cast<size_t>(groups) * N * H);
    FillWeights(w, H, 31);
    const std::vector<uint16_t> hw = w.Download();
    for (int tokens = 1; tokens <= cuda::kMoeExpertGemvMaxRows; ++tokens) {
      std::mt19937 rng(tokens);
      const RoutedTokens rt(s, tokens, 7 * tokens, rng);
      ExpectScatterAddMatches(s, N, rt, {.b = Bf(w), .b_group_stride = static_cast<int64_t>(N) * H}, rng,
                              [&](size_t row, int k) { return static_cast<double>(Bf16ToF32(hw[row * H + k])); });
    }
  }
}

// FP8 weights (b_fp8, b_row_scales) against float64 over the widened codes times their
// row's scale per 128 columns: the scatter-add, and the SiLU epilogue over the same codes
// read as interleaved gate/up rows.
TEST_F(CudaMoeExpertGemvTest, Fp8WeightsMatchFloat64) {
  // FP8 rows run on half-warps, 16 chunks of 8 codes a lane in two parts: 2048 columns a
  // pass (V2-Lite's gate_up: one full pass), 1408 (its down: 11 of 16 loads), 4608 (three
  // passes, the last partial), 144 (a partial scale block; the second part empty). N: three
  // tiles of 32 rows.
  const Shape two_passes{"three FP8 passes", 4608, 64, 8, 1, 2}, short_rows{"k 1408", 1408, 64, 16, 2, 6};
  for (const Shape& s : {kShapes[0], kShapes[5], two_passes, short_rows}) {
    const int H = s.hidden, N = 96, groups = s.experts + s.shared, kb = (H + 127) / 128;
    std::mt19937 rng(static_cast<uint32_t>(H));
    std::vector<uint8_t> codes(static_cast<size_t>(groups) * N * H);
    for (uint8_t& c : codes) {
      c = static_cast<uint8_t>(rng());
      if ((c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
    }
    std::vector<float> scales(static_cast<size_t>(groups) * N * kb);
    for (float& v : scales) v = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 10);
    Dev<uint8_t> dcodes(codes);
    Dev<float> dscales(scales);
    const cuda::MoeExpertGemvParams fp8{.b_group_stride = static_cast<int64_t>(N) * H, .b_fp8 = dcodes.get(),
                                        .b_row_scales = dscales.get()};
    auto weight = [&](size_t row, int k) {
      return static_cast<double>(F8E4M3ToF32(codes[row * H + k])) * scales[row * kb + k / 128];
    };
    for (int tokens = 1; tokens <= cuda::kMoeExpertGemvMaxRows; ++tokens) {
      const RoutedTokens rt(s, tokens, 11 * tokens, rng);
      ExpectScatterAddMatches(s, N, rt, fp8, rng, weight);

      // SiLU(gate) * up in bf16, a row per permuted row, gate and up rows interleaved in
      // blocks of 8.
      const int I = N / 2;
      Dev<uint16_t> act(static_cast<size_t>(rt.perm.rows) * I);
      cuda::MoeExpertGemvParams p = rt.Params(s, N, fp8);
      p.epilogue = cuda::GemmEpilogue::kSiluMulBf16;
      p.out = act.get();
      p.ldo = I;
      ASSERT_EQ(cuda::MoeExpertGemv(p, nullptr), cudaSuccess);
      const std::vector<uint16_t> got_act = act.Download();
      for (int g = 0; g < groups; ++g) {
        for (int q = rt.perm.offsets[g]; q < rt.perm.offsets[g + 1]; ++q) {
          const int t = rt.perm.token[q];
          for (int i = 0; i < I; ++i) {
            const size_t gate_row = static_cast<size_t>(g) * N + (i / 8) * 16 + i % 8, up_row = gate_row + 8;
            double gate = 0, up = 0, gate_mag = 0, up_mag = 0;
            for (int k = 0; k < H; ++k) {
              const double xv = Bf16ToF32(rt.x[static_cast<size_t>(t) * H + k]);
              const double pg = xv * weight(gate_row, k), pu = xv * weight(up_row, k);
              gate += pg;
              up += pu;
              gate_mag += std::fabs(pg);
              up_mag += std::fabs(pu);
            }
            const double want_act = Silu(gate) * up;
            const double tol = 2e-5 * (1.1 * gate_mag * std::fabs(up) + up_mag * std::fabs(Silu(gate))) +
                               0x1p-8 * std::fabs(want_act) + 1e-30;
            ASSERT_NEAR(Bf16ToF32(got_act[static_cast<size_t>(q) * I + i]), want_act, tol)
                << s.name << ", " << tokens << " tokens: row " << q << " column " << i;
          }
        }
      }
    }
  }
}


TEST_F(CudaMoeExpertGemvTest, ProgrammaticLaunchInAGraph) {
  // Permutation, gate_up and down chained by programmatic dependent launch and captured in
  // a graph (the shared experts' weights then load before the permutation has finished):
  // the same activations bit for bit as plain launches, the same scatter-add up to the
  // order of its float32 atomic adds.
  const Shape& s = kShapes[0];
  const int H = s.hidden, I = s.inter, groups = s.experts + s.shared;
  Dev<uint16_t> w1(static_cast<size_t>(groups) * 2 * I * H), w2(static_cast<size_t>(groups) * H * I);
  FillWeights(w1, H, 7);
  FillWeights(w2, I, 8);
  for (int tokens : {1, 3}) {
    std::vector<int32_t> ids;
    std::vector<float> route_weights;
    Route(tokens, s, 99 + tokens, &ids, &route_weights);
    Permutation perm(ids, route_weights, tokens, s);
    const int rows = perm.rows, max_active = std::min(groups, tokens * s.top_k + s.shared);
    std::mt19937 rng(tokens);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> hi(static_cast<size_t>(tokens) * H), lo(hi.size());
    for (size_t i = 0; i < hi.size(); ++i) {
      const float v = normal(rng);
      hi[i] = F32ToBf16(v);
      lo[i] = F32ToBf16(v - Bf16ToF32(hi[i]));
    }
    std::vector<float> base(static_cast<size_t>(tokens) * H);
    for (float& v : base) v = normal(rng);
    Dev<uint16_t> d_hi(hi), d_lo(lo);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto chain = [&](Dev<uint16_t>& act, Dev<uint16_t>& act_lo, Dev<float>& out) {
      ASSERT_EQ(cuda::MoePermute(perm.params, stream), cudaSuccess);
      ASSERT_EQ(cuda::MoeExpertGemv({.a = Bf(d_hi), .a_lo = Bf(d_lo), .lda = H, .a_rows = perm.d_token.get(),
                                     .a_row_count = tokens, .b = Bf(w1),
                                     .b_group_stride = static_cast<int64_t>(2) * I * H, .n = 2 * I, .k = H,
                                     .group_offsets = perm.d_offsets.get(),
                                     .active_groups = perm.d_active.get(), .num_active = perm.d_num.get(),
                                     .num_groups = groups, .num_static = s.shared, .max_active = max_active,
                                     .max_rows = tokens, .epilogue = cuda::GemmEpilogue::kSiluMulBf16,
                                     .out = act.get(), .ldo = I, .out_lo = Bf(act_lo)},
                                    stream),
                cudaSuccess);
      ASSERT_EQ(cuda::MoeExpertGemv({.a = Bf(act), .a_lo = Bf(act_lo), .lda = I, .b = Bf(w2),
                                     .b_group_stride = static_cast<int64_t>(H) * I, .n = H, .k = I,
                                     .group_offsets = perm.d_offsets.get(), .active_groups = perm.d_active.get(),
                                     .num_active = perm.d_num.get(), .num_groups = groups, .num_static = s.shared,
                                     .max_active = max_active, .max_rows = tokens,
                                     .epilogue = cuda::GemmEpilogue::kScatterAddF32, .out = out.get(), .ldo = H,
                                     .out_rows = perm.d_token.get(), .row_scale = perm.d_weight.get()},
                                    stream),
                cudaSuccess);
    };
    Dev<uint16_t> act1(static_cast<size_t>(rows) * I), lo1(act1.size()), act2(act1.size()), lo2(act1.size());
    Dev<float> out1(base), out2(base);
    chain(act1, lo1, out1);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> want = out1.Download();
    {
      const cuda::ScopedProgrammaticLaunch pdl(true);
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      chain(act2, lo2, out2);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(cudaMemcpyAsync(out2.get(), base.data(), base.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
                  cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(act1.Download(), act2.Download());
        EXPECT_EQ(lo1.Download(), lo2.Download());
        const std::vector<float> got = out2.Download();
        for (size_t j = 0; j < got.size(); ++j) ASSERT_NEAR(got[j], want[j], 1e-5f * (1.0f + std::fabs(want[j]))) << j;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      // Eager programmatic launches too.
      ASSERT_EQ(cudaMemcpy(out2.get(), base.data(), base.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      chain(act2, lo2, out2);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(act1.Download(), act2.Download());
      const std::vector<float> got = out2.Download();
      for (size_t j = 0; j < got.size(); ++j) ASSERT_NEAR(got[j], want[j], 1e-5f * (1.0f + std::fabs(want[j]))) << j;
    }
    EXPECT_FALSE(cuda::ProgrammaticLaunch());
    cudaStreamDestroy(stream);
  }
}

TEST_F(CudaMoeExpertGemvTest, EarlyStaticTilesEqualTheRoutedNormsRows) {
  // The model's chain at batch 1-4: MoeFusedRoute (norm, router, routing, permutation),
  // then gate_up either from the route kernel's normalized rows (h_bf16 + h_lo) or with the
  // shared experts' tiles computed before its wait from the residual it normalizes itself
  // (norm_x). The same bits either way, plain launches and graph-replayed programmatic ones.
  for (int si : {0, 1, 2}) {
    const Shape& s = kShapes[si];
    const int H = s.hidden, I = s.inter, groups = s.experts + s.shared;
    Dev<uint16_t> w1(static_cast<size_t>(groups) * 2 * I * H);
    FillWeights(w1, H, 11 + si);
    std::mt19937 rng(si);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> router(static_cast<size_t>(s.experts) * H), g(H);
    for (float& v : router) v = 0.05f * normal(rng);
    for (float& v : g) v = 1.0f + 0.1f * normal(rng);
    Dev<float> d_router(router), d_g(g);
    for (int tokens = 1; tokens <= cuda::kMoeFusedMaxTokens; ++tokens) {
      for (bool split : {true, false}) {
        std::vector<float> x(static_cast<size_t>(tokens) * H);
        for (float& v : x) v = 3.0f * normal(rng);
        const int per_token = s.top_k + s.shared, rows = tokens * per_token;
        const int max_active = std::min(groups, tokens * s.top_k + s.shared);
        Dev<float> d_x(x), d_logits(static_cast<size_t>(tokens) * s.experts), d_w(tokens * s.top_k),
            d_sorted_w(rows);
        Dev<uint32_t> d_counter(std::vector<uint32_t>{0});
        Dev<uint16_t> d_h(static_cast<size_t>(tokens) * H), d_lo(d_h.size());
        Dev<int32_t> d_ids(tokens * s.top_k), d_off(groups + 1), d_active(groups), d_num(1), d_token(rows),
            d_entry(rows);
        const cuda::MoeFusedRouteParams route{
            .x = d_x.get(), .x_stride = H, .norm_weight = d_g.get(), .norm_eps = 1e-6f, .hidden = H,
            .router = d_router.get(), .h_bf16 = Bf(d_h), .h_lo = split ? Bf(d_lo) : nullptr, .h_stride = H,
            .router_logits = d_logits.get(), .counter = d_counter.get(),
            .routing = {.logits = d_logits.get(), .logits_stride = s.experts, .num_tokens = tokens,
                        .num_experts = s.experts, .num_groups = 1, .topk_groups = 1, .top_k = s.top_k,
                        .scoring = cuda::MoeScoring::kSoftmax, .method = cuda::MoeTopk::kGreedy,
                        .expert_ids = d_ids.get(), .weights = d_w.get()},
            .permute = {.expert_ids = d_ids.get(), .weights = d_w.get(), .num_tokens = tokens, .top_k = s.top_k,
                        .num_experts = s.experts, .num_shared = s.shared, .group_offsets = d_off.get(),
                        .active_groups = d_active.get(), .num_active = d_num.get(), .sorted_token = d_token.get(),
                        .sorted_weight = d_sorted_w.get(), .entry_row = d_entry.get()}};
        auto gate_up = [&](bool early, Dev<uint16_t>& act, Dev<uint16_t>& act_lo) {
          return cuda::MoeExpertGemvParams{
              .a = Bf(d_h), .a_lo = split ? Bf(d_lo) : nullptr, .lda = H, .a_rows = d_token.get(),
              .a_row_count = tokens, .b = Bf(w1), .b_group_stride = static_cast<int64_t>(2) * I * H, .n = 2 * I,
              .k = H, .group_offsets = d_off.get(), .active_groups = d_active.get(), .num_active = d_num.get(),
              .num_groups = groups, .num_static = s.shared, .max_active = max_active, .max_rows = tokens,
              .epilogue = cuda::GemmEpilogue::kSiluMulBf16, .out = act.get(), .ldo = I,
              .out_lo = split ? Bf(act_lo) : nullptr, .norm_x = early ? d_x.get() : nullptr, .norm_x_stride = H,
              .norm_weight = d_g.get(), .norm_eps = 1e-6f, .static_begin = tokens * s.top_k};
        };
        Dev<uint16_t> act1(static_cast<size_t>(rows) * I), lo1(act1.size()), act2(act1.size()), lo2(act1.size()),
            act3(act1.size()), lo3(act1.size());
        ASSERT_EQ(cuda::MoeFusedRoute(route, nullptr), cudaSuccess);
        ASSERT_EQ(cuda::MoeExpertGemv(gate_up(false, act1, lo1), nullptr), cudaSuccess);
        ASSERT_EQ(cuda::MoeExpertGemv(gate_up(true, act2, lo2), nullptr), cudaSuccess);
        const std::string what = std::string(s.name) + " tokens " + std::to_string(tokens) + (split ? " split" : "");
        const std::vector<uint16_t> want = act1.Download(), want_lo = lo1.Download();
        EXPECT_EQ(act2.Download(), want) << what;
        if (split) {
          EXPECT_EQ(lo2.Download(), want_lo) << what;
        }
        // Every row was written (the buffers start as NaN bits).
        for (uint16_t v : want) ASSERT_FALSE(std::isnan(Bf16ToF32(v))) << what;
        // Route and early gate_up chained by programmatic launch in a graph, replayed.
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        {
          const cuda::ScopedProgrammaticLaunch pdl(true);
          cudaGraph_t graph;
          ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
          ASSERT_EQ(cuda::MoeFusedRoute(route, stream), cudaSuccess);
          ASSERT_EQ(cuda::MoeExpertGemv(gate_up(true, act3, lo3), stream), cudaSuccess);
          ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
          cudaGraphExec_t exec;
          ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
          for (int i = 0; i < 3; ++i) {
            ASSERT_EQ(cudaMemsetAsync(act3.get(), 0xff, act3.size() * 2, stream), cudaSuccess);
            ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            EXPECT_EQ(act3.Download(), want) << what << " graph " << i;
            if (split) {
              EXPECT_EQ(lo3.Download(), want_lo) << what << " graph " << i;
            }
          }
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
        }
        cudaStreamDestroy(stream);
      }
    }
  }
}

TEST_F(CudaMoeExpertGemvTest, RejectsBadParams) {
  Dev<uint16_t> w(64 * 64 * 4);
  Dev<int32_t> ints(64);
  Dev<float> out(64 * 64);
  const cuda::MoeExpertGemvParams good{
      .a = Bf(w), .lda = 64, .b = Bf(w), .b_group_stride = 64 * 64, .n = 64, .k = 64, .group_offsets = ints.get(),
      .active_groups = ints.get(), .num_active = ints.get(), .num_groups = 4, .num_static = 1, .max_active = 4,
      .max_rows = 1, .epilogue = cuda::GemmEpilogue::kScatterAddF32, .out = out.get(), .ldo = 64};
  auto with = [&](auto change) {
    cuda::MoeExpertGemvParams p = good;
    change(p);
    return cuda::MoeExpertGemv(p, nullptr);
  };
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.n = 72; }), cudaErrorInvalidValue);  // not a multiple of 16
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {  // ordered sums without tile counters
              p.partial = out.get();
              p.out_row_count = 1;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.k = 60; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.max_rows = 5; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.max_active = cuda::kMoeExpertGemvMaxActive + 1; }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.num_static = 5; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.epilogue = cuda::GemmEpilogue::kStoreF32; }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.ldo = 63; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.num_active = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) { p.a = Bf(w) + 1; }), cudaErrorInvalidValue);  // misaligned
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) { p.out_lo = Bf(w); }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](cuda::MoeExpertGemvParams& p) { p.a_row_count = 1; }), cudaErrorInvalidValue);  // no a_rows
  const auto early = [&](cuda::MoeExpertGemvParams& p) {  // valid early static tiles, as a base
    p.epilogue = cuda::GemmEpilogue::kSiluMulBf16;
    p.ldo = 32;
    p.a_rows = ints.get();
    p.a_row_count = 1;
    p.norm_x = out.get();
    p.norm_x_stride = 64;
    p.norm_weight = out.get();
    p.norm_eps = 1e-6f;
  };
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {  // early tiles of the scatter-add
              early(p);
              p.epilogue = cuda::GemmEpilogue::kScatterAddF32;
              p.ldo = 64;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {  // without the norm weights
              early(p);
              p.norm_weight = nullptr;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {  // misaligned residual rows
              early(p);
              p.norm_x = out.get() + 1;
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {  // NaN epsilon
              early(p);
              p.norm_eps = std::nanf("");
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(with([&](cuda::MoeExpertGemvParams& p) {
              p.a_rows = ints.get();
              p.a_row_count = 2;  // above max_rows
            }),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaMoeExpertGemvTest, V2LiteWeightBandwidth) {
  // Prints (asserts nothing about speed): a batch-1 MoE layer of DeepSeek-V2-Lite (6 routed
  // + 2 shared experts of 2048 x 1408, 92.3 MB gate_up + 46.1 MB down) with the GEMVs and
  // with the grouped GEMM the model used before, cycling over 4 layers' weights (more than
  // L2), launched back to back without and with programmatic dependent launch (then each
  // launch's static weights load while the previous kernel runs, as in the model).
  const Shape& s = kShapes[0];
  const int H = s.hidden, I = s.inter, groups = s.experts + s.shared, layers = 4;
  const int64_t per_layer = static_cast<int64_t>(groups) * 3 * I * H;
  Dev<uint16_t> weights(static_cast<size_t>(layers * per_layer));
  FillWeights(weights, H, 5);
  auto gate_up = [&](int l) { return Bf(weights) + l * per_layer; };
  auto down = [&](int l) { return Bf(weights) + l * per_layer + static_cast<int64_t>(groups) * 2 * I * H; };
  std::vector<int32_t> ids;
  std::vector<float> route_weights;
  Route(1, s, 3, &ids, &route_weights);
  Permutation perm(ids, route_weights, 1, s, 16);
  const int max_active = s.top_k + s.shared;
  Dev<uint16_t> h(std::vector<uint16_t>(H, F32ToBf16(0.5f))), h_lo(std::vector<uint16_t>(H, 0));
  Dev<uint16_t> act(static_cast<size_t>(max_active) * I), act_lo(act.size());
  Dev<float> out(std::vector<float>(H, 0.0f));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // mode 0: the grouped GEMM; 1: the GEMVs, gate_up staging each expert's rows; 2: the
  // GEMVs as the model runs them (gate_up stages the token row once).
  auto launch = [&](int mode, int l, bool up, bool dn) {
    if (mode > 0) {
      const cuda::MoeExpertGemvParams common{
          .group_offsets = perm.d_offsets.get(), .active_groups = perm.d_active.get(), .num_active = perm.d_num.get(),
          .num_groups = groups, .num_static = s.shared, .max_active = max_active, .max_rows = 1};
      if (up) {
        cuda::MoeExpertGemvParams p = common;
        p.a = Bf(h), p.a_lo = Bf(h_lo), p.lda = H, p.a_rows = perm.d_token.get(), p.a_row_count = mode == 2 ? 1 : 0;
        p.b = gate_up(l);
        p.b_group_stride = static_cast<int64_t>(2) * I * H, p.n = 2 * I, p.k = H;
        p.epilogue = cuda::GemmEpilogue::kSiluMulBf16, p.out = act.get(), p.ldo = I, p.out_lo = Bf(act_lo);
        ASSERT_EQ(cuda::MoeExpertGemv(p, stream), cudaSuccess);
      }
      if (dn) {
        cuda::MoeExpertGemvParams p = common;
        p.a = Bf(act), p.a_lo = Bf(act_lo), p.lda = I, p.b = down(l), p.b_group_stride = static_cast<int64_t>(H) * I;
        p.n = H, p.k = I, p.epilogue = cuda::GemmEpilogue::kScatterAddF32, p.out = out.get(), p.ldo = H;
        p.out_rows = perm.d_token.get(), p.row_scale = perm.d_weight.get();
        ASSERT_EQ(cuda::MoeExpertGemv(p, stream), cudaSuccess);
      }
      return;
    }
    // As the model's MoeExperts launches the grouped GEMM at batch 1 (16-row tiles).
    if (up) {
      ASSERT_EQ(cuda::GroupedGemm({.a = Bf(h), .lda = H, .a_rows = perm.d_token.get(), .a_lo = Bf(h_lo),
                                   .b = gate_up(l), .b_group_stride = static_cast<int64_t>(2) * I * H, .n = 2 * I,
                                   .k = H, .group_offsets = perm.d_offsets.get(), .tile_group = perm.d_tile_group.get(),
                                   .tile_row = perm.d_tile_row.get(), .num_tiles = perm.d_num_tiles.get(),
                                   .num_groups = groups, .max_active = max_active, .rows_hint = 16,
                                   .epilogue = cuda::GemmEpilogue::kSiluMulBf16, .out = act.get(), .ldo = I,
                                   .out_lo = Bf(act_lo)},
                                  stream),
                cudaSuccess);
    }
    if (dn) {
      ASSERT_EQ(cuda::GroupedGemm({.a = Bf(act), .lda = I, .a_lo = Bf(act_lo), .b = down(l),
                                   .b_group_stride = static_cast<int64_t>(H) * I, .n = H, .k = I,
                                   .group_offsets = perm.d_offsets.get(), .tile_group = perm.d_tile_group.get(),
                                   .tile_row = perm.d_tile_row.get(), .num_tiles = perm.d_num_tiles.get(),
                                   .num_groups = groups, .max_active = max_active, .rows_hint = 16,
                                   .epilogue = cuda::GemmEpilogue::kScatterAddF32, .out = out.get(), .ldo = H,
                                   .out_rows = perm.d_token.get(), .row_scale = perm.d_weight.get(), .split_k = 2},
                                  stream),
                cudaSuccess);
    }
  };
  const DevEvent e0, e1;
  const double up_bytes = 8.0 * 2 * I * H * 2, down_bytes = 8.0 * H * I * 2;
  for (const bool pdl : {false, true}) {
    const cuda::ScopedProgrammaticLaunch scoped(pdl);
    for (const int mode : {0, 1, 2}) {
      double us[3];
      for (int which = 0; which < 3; ++which) {  // gate_up, down, both
        const bool up = which != 1, dn = which != 0;
        for (int i = 0; i < 8; ++i) launch(mode, i % layers, up, dn);
        const int iters = 64;
        ASSERT_EQ(cudaEventRecord(e0.get(), stream), cudaSuccess);
        for (int i = 0; i < iters; ++i) launch(mode, i % layers, up, dn);
        ASSERT_EQ(cudaEventRecord(e1.get(), stream), cudaSuccess);
        ASSERT_EQ(cudaEventSynchronize(e1.get()), cudaSuccess);
        float ms = 0;
        ASSERT_EQ(cudaEventElapsedTime(&ms, e0.get(), e1.get()), cudaSuccess);
        us[which] = 1e3 * ms / iters;
      }
      const char* name[] = {"grouped GEMM", "GEMV, rows per expert", "GEMV (model)"};
      std::printf("V2-Lite batch 1, %-21s %s: gate_up %.1f us (%.2f TB/s), down %.1f us (%.2f TB/s), "
                  "both %.1f us (%.2f TB/s)\n",
                  name[mode], pdl ? "PDL on " : "PDL off", us[0], up_bytes / us[0] / 1e6,
                  us[1], down_bytes / us[1] / 1e6, us[2], (up_bytes + down_bytes) / us[2] / 1e6);
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
