// DeepSeek-V4's compressor entries on the GPU (CompressorEmit) against the CPU engine's
// Compressor::Emit arithmetic, rebuilt here from its parts: v4::PoolWindow over the biased
// gates, cpu::RmsNorm, then cpu::RopeCosSin + ApplyRope on the trailing channels (what
// v4::Rope::Apply does). Shapes: a CSA layer's windows (the previous window's Ca half with
// gates biased already, then this one's Cb half with the position bias added in the
// kernel), the indexer's first window (4 slots, no overlap), an HCA window of 128 slots;
// positions near 128K. exp and cos/sin come from different libms (CUDA's expf and cosf are
// within 2 ulp, glibc's within 1) and the double sum of squares adds in another order, so
// entries agree to 1e-5 of the entry's largest value, not bitwise. CopyRows is a plain
// float add and must match exactly. Skips, saying why, where no GPU is usable.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/deepseek_v4/v4_math.h"
#include "gtest/gtest.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cuda/v4_compressor.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;
using testing::NormalValues;

class CudaV4CompressorTest : public testing::GpuTest {};

// A host slot: indices into the host buffers, so the same slot can name device memory.
struct HostSlot {
  int64_t kv = -1, gate = -1, bias = -1;  // offsets into kv_buf, gate_buf, bias_buf (-1: none)
};

struct Case {
  std::string name;
  int64_t width;
  int rope_dim;
  int rate;
  bool overlap;  // CSA: 2 x rate slots from the second window on
  int64_t windows;
  int64_t first_window;  // index of the first window (positions = index * rate)
  float attention_factor;
};

std::vector<float> InverseFrequencies(int rope_dim) {
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / rope_dim));
  }
  return f;
}

TEST_F(CudaV4CompressorTest, EmitMatchesTheCpu) {
  for (const Case& c : {Case{"CSA", 512, 64, 4, true, 6, 32762, 1.0f},
                        Case{"indexer first window", 128, 64, 4, false, 1, 0, 1.0f},
                        Case{"HCA", 512, 64, 128, false, 3, 1021, 1.25f}}) {
    const int64_t width = c.width, proj = c.overlap ? 2 * width : width;
    const int64_t rows = c.windows * c.rate;
    // The pass's projections [rows][proj], the position bias [rate][proj], and the biased
    // Ca gates of the previous window [windows][rate][width] as the state keeps them.
    const std::vector<float> kv = NormalValues(static_cast<size_t>(rows * proj), 1.0f, 11);
    const std::vector<float> gate = NormalValues(static_cast<size_t>(rows * proj), 2.0f, 12);
    const std::vector<float> bias = NormalValues(static_cast<size_t>(c.rate * proj), 1.0f, 13);
    std::vector<float> prev_gate(static_cast<size_t>(c.windows * c.rate * width));
    std::vector<float> norm = NormalValues(static_cast<size_t>(width), 0.1f, 14);
    for (float& x : norm) x += 1.0f;
    const std::vector<float> inv_freq = InverseFrequencies(c.rope_dim);
    const float eps = 1e-6f;

    const int max_slots = c.overlap ? 2 * c.rate : c.rate;
    std::vector<HostSlot> slots(static_cast<size_t>(c.windows * max_slots));
    std::vector<int32_t> num_slots(static_cast<size_t>(c.windows)), positions(num_slots.size());
    for (int64_t w = 0; w < c.windows; ++w) {
      HostSlot* ws = &slots[static_cast<size_t>(w * max_slots)];
      int n = 0;
      if (c.overlap && w > 0) {
        for (int j = 0; j < c.rate; ++j) {
          const int64_t row = (w - 1) * c.rate + j;
          const int64_t at = (w * c.rate + j) * width;
          for (int64_t i = 0; i < width; ++i) {
            prev_gate[static_cast<size_t>(at + i)] = gate[static_cast<size_t>(row * proj + i)] + bias[static_cast<size_t>(j * proj + i)];
          }
          // Every other Ca slot names the raw gate and the bias instead: the same value.
          ws[n++] = j % 2 == 0 ? HostSlot{row * proj, at, -1} : HostSlot{row * proj, row * proj, j * proj};
        }
      }
      const int64_t half = c.overlap ? width : 0;
      for (int j = 0; j < c.rate; ++j) {
        const int64_t row = w * c.rate + j;
        ws[n++] = HostSlot{row * proj + half, row * proj + half, j * proj + half};
      }
      num_slots[static_cast<size_t>(w)] = n;
      positions[static_cast<size_t>(w)] = static_cast<int32_t>((c.first_window + w) * c.rate);
    }

    // The reference, entry by entry.
    const int64_t out_stride = width + 3;  // the gaps must stay untouched
    std::vector<float> want(static_cast<size_t>(c.windows * out_stride), NAN);
    for (int64_t w = 0; w < c.windows; ++w) {
      const int n = num_slots[static_cast<size_t>(w)];
      std::vector<std::vector<float>> biased(static_cast<size_t>(n));
      std::vector<const float*> k, g;
      for (int s = 0; s < n; ++s) {
        const HostSlot& hs = slots[static_cast<size_t>(w * max_slots + s)];
        const float* gsrc = hs.bias >= 0 ? &gate[static_cast<size_t>(hs.gate)] : &prev_gate[static_cast<size_t>(hs.gate)];
        biased[static_cast<size_t>(s)].assign(gsrc, gsrc + width);
        if (hs.bias >= 0) {
          for (int64_t i = 0; i < width; ++i) biased[static_cast<size_t>(s)][static_cast<size_t>(i)] += bias[static_cast<size_t>(hs.bias + i)];
        }
        k.push_back(&kv[static_cast<size_t>(hs.kv)]);
        g.push_back(biased[static_cast<size_t>(s)].data());
      }
      float* out = &want[static_cast<size_t>(w * out_stride)];
      v4::PoolWindow(k.data(), g.data(), n, width, out);
      cpu::RmsNorm(out, 1, width, width, norm.data(), eps, out, width);
      std::vector<float> cos(inv_freq.size()), sin(inv_freq.size());
      cpu::RopeCosSin(positions[static_cast<size_t>(w)], inv_freq.data(), c.rope_dim / 2, c.attention_factor,
                      cos.data(), sin.data());
      cpu::ApplyRope(out + width - c.rope_dim, cos.data(), sin.data(), c.rope_dim / 2, /*interleaved=*/true);
    }

    Dev<float> dkv(kv), dgate(gate), dbias(bias), dprev(prev_gate), dnorm(norm), dfreq(inv_freq), dout(want.size());
    std::vector<cuda::CompressorSlot> dev_slots(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      const HostSlot& hs = slots[i];
      if (hs.kv < 0) continue;
      dev_slots[i] = {.kv = dkv.get() + hs.kv,
                      .gate = hs.bias >= 0 ? dgate.get() + hs.gate : dprev.get() + hs.gate,
                      .bias = hs.bias >= 0 ? dbias.get() + hs.bias : nullptr};
    }
    std::vector<float*> outs(static_cast<size_t>(c.windows));
    for (int64_t w = 0; w < c.windows; ++w) outs[static_cast<size_t>(w)] = dout.get() + w * out_stride;
    Dev<cuda::CompressorSlot> dslots(dev_slots);
    Dev<int32_t> dnum(num_slots), dpos(positions);
    Dev<float*> douts(outs);
    ASSERT_EQ(cuda::CompressorEmit({.slots = dslots.get(), .num_slots = dnum.get(), .max_slots = max_slots,
                                    .windows = c.windows, .width = width, .norm = dnorm.get(), .eps = eps,
                                    .positions = dpos.get(), .inv_freq = dfreq.get(), .rope_dim = c.rope_dim,
                                    .attention_factor = c.attention_factor, .out = douts.get()},
                                   nullptr),
              cudaSuccess)
        << c.name;
    const std::vector<float> got = dout.Download();
    for (int64_t w = 0; w < c.windows; ++w) {
      const float* want_w = &want[static_cast<size_t>(w * out_stride)];
      const float* got_w = &got[static_cast<size_t>(w * out_stride)];
      float scale = 0.0f;
      for (int64_t i = 0; i < width; ++i) scale = std::max(scale, std::fabs(want_w[i]));
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_NEAR(got_w[i], want_w[i], 1e-5f * scale) << c.name << " window " << w << " @" << i;
      }
      for (int64_t i = width; i < out_stride; ++i) EXPECT_TRUE(std::isnan(got_w[i])) << c.name << " wrote the gap";
    }
  }
}

TEST_F(CudaV4CompressorTest, EmitRefusesBadParamsAndMarksBadWindows) {
  Dev<float> f(64);
  Dev<cuda::CompressorSlot> slots(std::vector<cuda::CompressorSlot>{{f.get(), f.get(), nullptr}});
  Dev<int32_t> num(std::vector<int32_t>{2}), pos(std::vector<int32_t>{0});
  Dev<float*> outs(std::vector<float*>{f.get()});
  cuda::CompressorEmitParams p{.slots = slots.get(), .num_slots = num.get(), .max_slots = 1, .windows = 1,
                               .width = 8, .norm = f.get(), .eps = 1e-6f, .positions = pos.get(),
                               .inv_freq = f.get(), .rope_dim = 3, .out = outs.get()};
  EXPECT_EQ(cuda::CompressorEmit(p, nullptr), cudaErrorInvalidValue) << "odd rope_dim";
  p.rope_dim = 10;
  EXPECT_EQ(cuda::CompressorEmit(p, nullptr), cudaErrorInvalidValue) << "rope wider than the entry";
  p.rope_dim = 4;
  p.max_slots = 0;
  EXPECT_EQ(cuda::CompressorEmit(p, nullptr), cudaErrorInvalidValue) << "no slots";
  p.max_slots = 1;
  // num_slots 2 > max_slots 1: the entry is NaN rather than read past the window's slots.
  ASSERT_EQ(cudaMemset(f.get(), 0, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cuda::CompressorEmit(p, nullptr), cudaSuccess);
  const std::vector<float> got = f.Download();
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(std::isnan(got[static_cast<size_t>(i)])) << i;
}

TEST_F(CudaV4CompressorTest, CopyRowsAddsTheBiasOrCopies) {
  const int64_t width = 300, rows = 5;
  const std::vector<float> src = NormalValues(static_cast<size_t>(rows * width), 1.0f, 21);
  const std::vector<float> bias = NormalValues(static_cast<size_t>(rows * width), 1.0f, 22);
  Dev<float> dsrc(src), dbias(bias), ddst(static_cast<size_t>(rows * width));
  // Rows go to the destination reversed; rows 1 and 3 have no bias.
  std::vector<const float*> s, b;
  std::vector<float*> d;
  for (int64_t r = 0; r < rows; ++r) {
    s.push_back(dsrc.get() + r * width);
    b.push_back(r % 2 == 1 ? nullptr : dbias.get() + r * width);
    d.push_back(ddst.get() + (rows - 1 - r) * width);
  }
  Dev<const float*> ds(s), db(b);
  Dev<float*> dd(d);
  ASSERT_EQ(cuda::CopyRows({.src = ds.get(), .bias = db.get(), .dst = dd.get(), .rows = rows, .width = width}, nullptr),
            cudaSuccess);
  std::vector<float> got = ddst.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      const size_t at = static_cast<size_t>(r * width + i);
      const float want = r % 2 == 1 ? src[at] : src[at] + bias[at];
      ASSERT_EQ(got[static_cast<size_t>((rows - 1 - r) * width + i)], want) << r << " @" << i;
    }
  }
  // No bias array at all: plain copies.
  ASSERT_EQ(cuda::CopyRows({.src = ds.get(), .bias = nullptr, .dst = dd.get(), .rows = rows, .width = width}, nullptr),
            cudaSuccess);
  got = ddst.Download();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      ASSERT_EQ(got[static_cast<size_t>((rows - 1 - r) * width + i)], src[static_cast<size_t>(r * width + i)]);
    }
  }
  EXPECT_EQ(cuda::CopyRows({.src = nullptr, .dst = dd.get(), .rows = 1, .width = 4}, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
