// DeepSeek-V4's sink attention on the GPU against the CPU engine's (v4::AttendWithSink),
// over V4-Flash's shape (64 heads of 512, a 128-row window plus 512 chosen entries) and odd
// ones: empty key lists, repeated keys, large and very negative sinks, null keys and
// overlong lists refused; each with and without scratch for splitting the key lists.
// The dot products sum in another order than the CPU's, so outputs agree to a relative
// 1e-5 of the values' scale, not bitwise. Skips, saying why, where no GPU is usable.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/deepseek_v4/v4_math.h"
#include "gtest/gtest.h"
#include "kernels/cuda/sink_attention.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;

class CudaSinkAttentionTest : public testing::GpuTest {};

struct Case {
  int tokens, heads, head_dim, pool_rows, max_keys;
  float sink_scale;
};

TEST_F(CudaSinkAttentionTest, MatchesTheCpuOverShapes) {
  for (const Case c : {Case{3, 64, 512, 2000, 640, 1.0f}, Case{1, 64, 512, 2000, 640, 1.0f},
                       Case{20, 4, 64, 50, 40, 3.0f}, Case{5, 2, 4, 7, 9, 30.0f}, Case{2, 8, 128, 300, 3000, 1.0f},
                       Case{2, 5, 1024, 900, 700, 1.0f}, Case{1, 3, 260, 400, 8192, 2.0f}}) {
    const std::string what = std::to_string(c.heads) + " heads of " + std::to_string(c.head_dim) + ", " +
                             std::to_string(c.max_keys) + " keys";
    std::mt19937 rng(c.heads * 1000 + c.head_dim);
    std::normal_distribution<float> d(0.0f, 1.0f);
    const int64_t stride = c.head_dim + 4;
    std::vector<float> q(static_cast<size_t>(c.tokens * c.heads * c.head_dim)), kv(static_cast<size_t>(c.pool_rows * stride));
    std::vector<float> sinks(static_cast<size_t>(c.heads));
    for (float& x : q) x = d(rng);
    for (float& x : kv) x = d(rng);
    for (float& x : sinks) x = c.sink_scale * d(rng);
    sinks[0] = -1e30f;  // a head whose sink never counts
    std::vector<int32_t> rows(static_cast<size_t>(c.tokens * c.max_keys), -7), num(static_cast<size_t>(c.tokens));
    for (int t = 0; t < c.tokens; ++t) {
      num[t] = t == 1 ? 0 : static_cast<int32_t>(c.max_keys - (t * 13) % std::max(1, c.max_keys / 2));
      for (int j = 0; j < num[t]; ++j) rows[static_cast<size_t>(t * c.max_keys + j)] = static_cast<int32_t>(rng() % c.pool_rows);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want(q.size()), scratch(static_cast<size_t>(c.max_keys) + 1);
    for (int t = 0; t < c.tokens; ++t) {
      std::vector<const float*> keys;
      for (int j = 0; j < num[t]; ++j) keys.push_back(&kv[static_cast<size_t>(rows[t * c.max_keys + j] * stride)]);
      for (int h = 0; h < c.heads; ++h) {
        const size_t at = static_cast<size_t>((t * c.heads + h) * c.head_dim);
        v4::AttendWithSink(&q[at], keys.data(), num[t], c.head_dim, scale, sinks[h], scratch.data(), &want[at]);
      }
    }
    Dev<float> dq(q), dkv(kv), dsinks(sinks), dout(q.size());
    Dev<int32_t> dnum(num), dbad(std::vector<int32_t>{0});
    // The key lists as the GPU takes them: device pointers at the same rows.
    std::vector<const float*> key_ptrs(rows.size(), nullptr);
    for (int t = 0; t < c.tokens; ++t) {
      for (int j = 0; j < num[t]; ++j) {
        const size_t at = static_cast<size_t>(t * c.max_keys + j);
        key_ptrs[at] = dkv.get() + static_cast<int64_t>(rows[at]) * stride;
      }
    }
    Dev<const float*> dkeys(key_ptrs);
    // Without scratch every block takes a whole key list; with it, small batches split
    // their lists over blocks and merge the splits.
    const int64_t partial_floats = cuda::SinkAttentionPartialFloats(c.tokens, c.heads, c.head_dim, c.max_keys);
    if (c.tokens == 1 && c.max_keys >= 640) {
      EXPECT_GT(partial_floats, 0) << what << ": a lone token splits";
    }
    Dev<float> dpartials(static_cast<size_t>(std::max<int64_t>(partial_floats, 1)));
    for (const bool split : {false, true}) {
      const cuda::SinkAttentionParams p{
          .q = dq.get(), .keys = dkeys.get(), .num_keys = dnum.get(), .max_keys = c.max_keys,
          .sinks = dsinks.get(), .tokens = c.tokens, .heads = c.heads, .head_dim = c.head_dim, .scale = scale,
          .out = dout.get(), .bad_input = dbad.get(), .partials = split ? dpartials.get() : nullptr,
          .partial_floats = split ? partial_floats : 0};
      ASSERT_EQ(cuda::SinkAttention(p, nullptr), cudaSuccess) << what;
      const std::vector<float> got = dout.Download();
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << what << (split ? " split" : "") << " @"
                                                                         << i;
      }
      EXPECT_EQ(dbad.Download()[0], 0) << what;
    }
  }
}

TEST_F(CudaSinkAttentionTest, NullKeysAndOverlongListsAreRefusedPerToken) {
  const int heads = 2, d = 8, rows_in_pool = 10, max_keys = 4;
  std::vector<float> q(static_cast<size_t>(3 * heads * d), 0.5f), kv(static_cast<size_t>(rows_in_pool * d), 1.0f);
  Dev<float> dq(q), dkv(kv), dsinks(std::vector<float>{0.0f, 0.0f}), dout(q.size());
  auto row = [&](int r) -> const float* { return dkv.get() + r * d; };
  // Token 0 is fine; token 1 names a null key; token 2 claims max_keys + 1 keys.
  const std::vector<const float*> keys = {row(0), row(1), row(2), row(3), row(4), nullptr, row(5), row(6),
                                          row(7), row(8), row(9), row(0)};
  Dev<const float*> dkeys(keys);
  Dev<int32_t> dnum(std::vector<int32_t>{4, 4, max_keys + 1}), dbad(std::vector<int32_t>{0});
  ASSERT_EQ(cuda::SinkAttention({.q = dq.get(), .keys = dkeys.get(), .num_keys = dnum.get(), .max_keys = max_keys,
                                 .sinks = dsinks.get(), .tokens = 3, .heads = heads, .head_dim = d, .scale = 1.0f,
                                 .out = dout.get(), .bad_input = dbad.get()},
                                nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.Download();
  EXPECT_EQ(dbad.Download()[0], 1);
  // Token 0 attends: every key is ones and scores q . k = 4, so each channel is
  // 4 e^4 / (4 e^4 + e^0) (the sink 0); tokens 1 and 2: zeros.
  const float want = 4.0f * std::exp(4.0f) / (4.0f * std::exp(4.0f) + 1.0f);
  for (int i = 0; i < heads * d; ++i) EXPECT_NEAR(got[static_cast<size_t>(i)], want, 1e-6f) << i;
  for (int i = heads * d; i < 3 * heads * d; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 0.0f) << i;
}

TEST_F(CudaSinkAttentionTest, ABadListIsRefusedByEverySplit) {
  // One token, lists long enough to split: a null key in the last split still zeroes every
  // head's output; the next token (no split of its own list is bad) attends.
  const int heads = 4, d = 128, max_keys = 1024;
  std::vector<float> q(static_cast<size_t>(2 * heads * d), 0.01f), kv(static_cast<size_t>(d), 1.0f);
  Dev<float> dq(q), dkv(kv), dsinks(std::vector<float>(heads, 0.0f)), dout(std::vector<float>(q.size(), 7.0f));
  std::vector<const float*> keys(static_cast<size_t>(2 * max_keys), dkv.get());
  keys[1000] = nullptr;
  Dev<const float*> dkeys(keys);
  Dev<int32_t> dnum(std::vector<int32_t>{max_keys, max_keys}), dbad(std::vector<int32_t>{0});
  const int64_t partial_floats = cuda::SinkAttentionPartialFloats(2, heads, d, max_keys);
  ASSERT_GT(partial_floats, 0);
  Dev<float> dpartials(static_cast<size_t>(partial_floats));
  ASSERT_EQ(cuda::SinkAttention({.q = dq.get(), .keys = dkeys.get(), .num_keys = dnum.get(), .max_keys = max_keys,
                                 .sinks = dsinks.get(), .tokens = 2, .heads = heads, .head_dim = d, .scale = 1.0f,
                                 .out = dout.get(), .bad_input = dbad.get(), .partials = dpartials.get(),
                                 .partial_floats = partial_floats},
                                nullptr),
            cudaSuccess);
  const std::vector<float> got = dout.Download();
  EXPECT_EQ(dbad.Download()[0], 1);
  // Token 1: every score 1.28, so each channel is 1024 e^1.28 / (1024 e^1.28 + 1).
  const float want = 1024.0f * std::exp(1.28f) / (1024.0f * std::exp(1.28f) + 1.0f);
  for (int i = 0; i < heads * d; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], 0.0f) << i;
  for (int i = heads * d; i < 2 * heads * d; ++i) EXPECT_NEAR(got[static_cast<size_t>(i)], want, 1e-6f) << i;
}

TEST_F(CudaSinkAttentionTest, BadParamsAreRefused) {
  Dev<float> f(64);
  Dev<int32_t> i(64);
  Dev<const float*> k(4);
  cuda::SinkAttentionParams p{.q = f.get(), .keys = k.get(), .num_keys = i.get(), .max_keys = 4, .sinks = f.get(),
                              .tokens = 1, .heads = 1, .head_dim = 6, .out = f.get()};
  EXPECT_EQ(cuda::SinkAttention(p, nullptr), cudaErrorInvalidValue) << "head_dim not a multiple of 4";
  p.head_dim = 8;
  p.max_keys = cuda::kMaxSinkAttentionKeys + 1;
  EXPECT_EQ(cuda::SinkAttention(p, nullptr), cudaErrorInvalidValue);
  p.max_keys = 4;
  p.keys = nullptr;
  EXPECT_EQ(cuda::SinkAttention(p, nullptr), cudaErrorInvalidValue) << "no key lists";
  p.keys = k.get();
  p.partial_floats = 100;
  EXPECT_EQ(cuda::SinkAttention(p, nullptr), cudaErrorInvalidValue) << "scratch claimed, none given";
}

}  // namespace
}  // namespace tandem
