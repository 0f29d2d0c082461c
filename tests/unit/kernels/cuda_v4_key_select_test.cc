// DeepSeek-V4's key lists on the GPU (V4KeySelect) against the CPU engine's RunAttention
// loop rebuilt here: window keys by position (the pass's rows from the sequence's first new
// position on, the ring before), then every visible entry (HCA) or the indexer's top k
// (CSA: cpu::Dot scores, v4::TopK). Pointers are compared exactly. The GPU's dot products
// sum in another order, so CSA scores agree to 1e-5 of the sum of their terms' magnitudes,
// and the chosen sets must be equal wherever the reference's k-th and (k+1)-th scores
// differ by more than 1e-4 relative; closer than that, a swap at the boundary is allowed
// (only entries scoring within that margin of the k-th may differ). With exact ties (equal
// index keys score bitwise alike on both sides) the choice must match exactly. Skips,
// saying why, where no GPU is usable.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/model/deepseek_v4/v4_math.h"
#include "gtest/gtest.h"
#include "kernels/cpu/vec.h"
#include "kernels/cuda/v4_key_select.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;
using testing::NormalValues;

class CudaV4KeySelectTest : public testing::GpuTest {};

struct Seq {
  int start;       // first new position of the pass
  int new_tokens;  // positions start .. start + new_tokens - 1
  int entries;     // compressed entries after the pass
};

struct Case {
  std::string name;
  int type;
  int window, head_dim, rate;
  int index_heads, index_head_dim, topk;
  std::vector<Seq> seqs;
  int max_keys = 0;         // 0: the largest list exactly
  int64_t max_entries = 0;  // 0: the largest visible count exactly
  int distinct_keys = 0;    // > 0: index keys drawn from this many rows only (exact ties)
  bool zero_first_query = false;  // token 0's indexer queries all zero: every score 0
};

void RunCase(const Case& c) {
  const int S = static_cast<int>(c.seqs.size());
  const bool csa = c.type == cuda::kV4KeysCompressedSparse;
  const int ni = c.index_heads, ci = c.index_head_dim, d = c.head_dim;
  // Tokens, sequence by sequence; the pass's rows in the same order.
  std::vector<int32_t> token_seq, token_pos, seq_start, seq_row0, seq_entries;
  std::vector<int64_t> seq_entry_begin;
  int64_t total_entries = 0;
  for (int s = 0; s < S; ++s) {
    seq_start.push_back(c.seqs[s].start);
    seq_row0.push_back(static_cast<int32_t>(token_seq.size()));
    seq_entries.push_back(c.seqs[s].entries);
    seq_entry_begin.push_back(total_entries);
    total_entries += c.seqs[s].entries;
    for (int i = 0; i < c.seqs[s].new_tokens; ++i) {
      token_seq.push_back(s);
      token_pos.push_back(c.seqs[s].start + i);
    }
  }
  const int64_t tokens = static_cast<int64_t>(token_seq.size());
  // Entry rows: a shuffled pool with a few spare rows, so the indirection shows.
  const int64_t pool_rows = total_entries + 3;
  std::vector<int64_t> perm(static_cast<size_t>(pool_rows));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(c.topk * 7 + c.window));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> entry_rows(perm.begin(), perm.begin() + total_entries);
  std::vector<float> index_keys = NormalValues(static_cast<size_t>(pool_rows * std::max(ci, 1)), 1.0f, 31);
  if (c.distinct_keys > 0) {
    for (int64_t r = 0; r < pool_rows; ++r) {
      const int64_t from = r % c.distinct_keys;
      std::copy_n(&index_keys[static_cast<size_t>(from * ci)], ci, &index_keys[static_cast<size_t>(r * ci)]);
    }
  }
  std::vector<float> index_q = NormalValues(static_cast<size_t>(std::max<int64_t>(tokens * ni * ci, 1)), 1.0f, 32);
  const std::vector<float> index_w = NormalValues(static_cast<size_t>(std::max<int64_t>(tokens * ni, 1)), 1.0f, 33);
  if (c.zero_first_query) std::fill_n(index_q.begin(), ni * ci, 0.0f);

  // The reference lists, as (kind, index) pairs: window keys by position, entries by index.
  const float key_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ci)));
  const float head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ni)));
  struct Want {
    int first = 0, window = 0, visible = 0;
    std::vector<int32_t> chosen;  // entry indices, ascending
    std::vector<float> scores;    // CSA with a selection: the reference scores
    std::vector<float> magnitude;  // and the sums of their terms' magnitudes
  };
  std::vector<Want> want(static_cast<size_t>(tokens));
  int longest = 0;
  int64_t most_visible = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    Want& w = want[static_cast<size_t>(t)];
    const int s = token_seq[static_cast<size_t>(t)], pos = token_pos[static_cast<size_t>(t)];
    w.first = std::max(0, pos - c.window + 1);
    w.window = pos - w.first + 1;
    w.visible = c.type == cuda::kV4KeysSliding ? 0 : std::min((pos + 1) / c.rate, seq_entries[static_cast<size_t>(s)]);
    if (c.type == cuda::kV4KeysHeavilyCompressed || (csa && w.visible <= c.topk)) {
      w.chosen.resize(static_cast<size_t>(w.visible));
      std::iota(w.chosen.begin(), w.chosen.end(), 0);
    } else if (csa) {
      for (int e = 0; e < w.visible; ++e) {
        const float* key = &index_keys[static_cast<size_t>(entry_rows[static_cast<size_t>(seq_entry_begin[s] + e)] * ci)];
        float score = 0.0f, magnitude = 0.0f;
        for (int h = 0; h < ni; ++h) {
          const float* q = &index_q[static_cast<size_t>((t * ni + h) * ci)];
          const float dot = cpu::Dot(q, key, ci);
          score += (std::max(dot, 0.0f) * key_scale) * (index_w[static_cast<size_t>(t * ni + h)] * head_scale);
          float abs_dot = 0.0f;
          for (int i = 0; i < ci; ++i) abs_dot += std::fabs(q[i] * key[i]);
          magnitude += abs_dot * key_scale * std::fabs(index_w[static_cast<size_t>(t * ni + h)]) * head_scale;
        }
        w.scores.push_back(score);
        w.magnitude.push_back(magnitude);
      }
      v4::TopK(w.scores.data(), w.visible, c.topk, &w.chosen);
    }
    longest = std::max(longest, w.window + static_cast<int>(w.chosen.size()));
    most_visible = std::max<int64_t>(most_visible, w.visible);
  }
  const int max_keys = c.max_keys > 0 ? c.max_keys : longest;
  const int64_t max_entries = c.max_entries > 0 ? c.max_entries : std::max<int64_t>(most_visible, 1);

  const int64_t stride = d + 4;
  Dev<float> chunk(static_cast<size_t>(tokens * stride)), rings(static_cast<size_t>(S * c.window * d));
  Dev<float> entries(static_cast<size_t>(pool_rows * d)), dkeys(index_keys), dq(index_q), dw(index_w);
  std::vector<const float*> ring_ptrs;
  // A sequence starting at 0 needs no ring: null, which must not matter.
  for (int s = 0; s < S; ++s) ring_ptrs.push_back(c.seqs[s].start == 0 ? nullptr : rings.get() + s * c.window * d);
  Dev<int32_t> dseq(token_seq), dpos(token_pos), dstart(seq_start), drow0(seq_row0), dentries(seq_entries);
  Dev<int64_t> dbegin(seq_entry_begin), drows(entry_rows.empty() ? std::vector<int64_t>{0} : entry_rows);
  Dev<const float*> dring(ring_ptrs), dout(static_cast<size_t>(tokens * max_keys));
  Dev<float> scores(static_cast<size_t>(tokens * max_entries));
  Dev<int32_t> dnum(static_cast<size_t>(tokens)), dbad(std::vector<int32_t>{0});
  const cuda::V4KeySelectParams p{
      .tokens = tokens, .token_seq = dseq.get(), .token_pos = dpos.get(), .seq_start = dstart.get(),
      .seq_row0 = drow0.get(), .seq_ring = dring.get(), .seq_entries = dentries.get(),
      .seq_entry_begin = dbegin.get(), .chunk_kv = chunk.get(), .chunk_kv_stride = stride, .window = c.window,
      .head_dim = d, .type = c.type, .rate = c.rate, .entry_rows = drows.get(), .entries = entries.get(),
      .index_keys = dkeys.get(), .index_q = dq.get(), .index_w = dw.get(), .index_heads = ni,
      .index_head_dim = ci, .topk = c.topk, .scores = scores.get(), .max_entries = max_entries,
      .keys = dout.get(), .num_keys = dnum.get(), .max_keys = max_keys, .bad_input = dbad.get()};
  ASSERT_EQ(cuda::V4KeySelect(p, nullptr), cudaSuccess) << c.name;
  const std::vector<const float*> got = dout.Download();
  const std::vector<int32_t> num = dnum.Download();
  const std::vector<float> got_scores = scores.Download();
  bool any_bad = false;
  for (int64_t t = 0; t < tokens; ++t) {
    const Want& w = want[static_cast<size_t>(t)];
    const int s = token_seq[static_cast<size_t>(t)];
    const std::string at = c.name + ", token " + std::to_string(t) + " at " + std::to_string(token_pos[t]);
    const int k = static_cast<int>(w.chosen.size());
    if (w.window + k > max_keys || (csa && w.visible > max_entries)) {
      any_bad = true;
      EXPECT_EQ(num[static_cast<size_t>(t)], 0) << at;
      continue;
    }
    ASSERT_EQ(num[static_cast<size_t>(t)], w.window + k) << at;
    const float* const* list = &got[static_cast<size_t>(t * max_keys)];
    for (int i = 0; i < w.window; ++i) {
      const int j = w.first + i;
      const float* expect = j >= seq_start[s] ? chunk.get() + (seq_row0[s] + j - seq_start[s]) * stride
                                              : ring_ptrs[static_cast<size_t>(s)] + (j % c.window) * d;
      ASSERT_EQ(list[i], expect) << at << ", window key " << i;
    }
    // The entries named, back to entry indices through the row map.
    std::vector<int32_t> chosen;
    for (int i = 0; i < k; ++i) {
      const int64_t row = (list[w.window + i] - entries.get()) / d;
      ASSERT_EQ(list[w.window + i], entries.get() + row * d) << at;
      const auto begin = entry_rows.begin() + seq_entry_begin[s];
      const auto found = std::find(begin, begin + seq_entries[s], row);
      ASSERT_NE(found, begin + seq_entries[s]) << at << ": not one of the sequence's entries";
      chosen.push_back(static_cast<int32_t>(found - begin));
    }
    ASSERT_TRUE(std::is_sorted(chosen.begin(), chosen.end())) << at;
    ASSERT_EQ(std::set<int32_t>(chosen.begin(), chosen.end()).size(), chosen.size()) << at;
    if (w.scores.empty() || c.distinct_keys > 0) {
      EXPECT_EQ(chosen, w.chosen) << at;
      if (w.scores.empty()) continue;
    }
    for (int e = 0; e < w.visible; ++e) {
      ASSERT_NEAR(got_scores[static_cast<size_t>(t * max_entries + e)], w.scores[static_cast<size_t>(e)],
                  1e-5f * w.magnitude[static_cast<size_t>(e)] + 1e-30f)
          << at << ", entry " << e;
    }
    // The k-th and (k+1)-th reference scores (TopK's order).
    std::vector<int32_t> order(static_cast<size_t>(w.visible));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return w.scores[static_cast<size_t>(a)] > w.scores[static_cast<size_t>(b)]; });
    const float kth = w.scores[static_cast<size_t>(order[static_cast<size_t>(k - 1)])];
    const float next = w.scores[static_cast<size_t>(order[static_cast<size_t>(k)])];
    const float margin = 1e-4f * std::max(std::fabs(kth), std::fabs(next));
    if (kth - next > margin) {
      EXPECT_EQ(chosen, w.chosen) << at;
    } else {
      std::vector<int32_t> diff;
      std::set_symmetric_difference(chosen.begin(), chosen.end(), w.chosen.begin(), w.chosen.end(),
                                    std::back_inserter(diff));
      for (int32_t e : diff) {
        EXPECT_LE(std::fabs(w.scores[static_cast<size_t>(e)] - kth), margin) << at << ": entry " << e << " differs";
      }
    }
  }
  EXPECT_EQ(dbad.Download()[0], any_bad ? 1 : 0) << c.name;
}

TEST_F(CudaV4KeySelectTest, SlidingWindowMixesRingAndChunk) {
  // Sequence 0 resumes at 5 (ring for 0..4, positions below the window), sequence 1 is
  // fresh (no ring), sequence 2 resumes mid-stream at 40 (the window wraps the ring).
  RunCase({.name = "sliding", .type = cuda::kV4KeysSliding, .window = 8, .head_dim = 16, .rate = 0,
           .index_heads = 0, .index_head_dim = 0, .topk = 0,
           .seqs = {{5, 8, 0}, {0, 3, 0}, {40, 10, 0}}});
}

TEST_F(CudaV4KeySelectTest, HeavilyCompressedSeesEveryVisibleEntry) {
  // Starts in the middle of a window; entries appear every 4 positions, capped by what
  // the sequence has after the pass.
  RunCase({.name = "HCA", .type = cuda::kV4KeysHeavilyCompressed, .window = 8, .head_dim = 32, .rate = 4,
           .index_heads = 0, .index_head_dim = 0, .topk = 0,
           .seqs = {{6, 8, 3}, {0, 5, 1}, {130, 3, 33}}});
  RunCase({.name = "HCA 128", .type = cuda::kV4KeysHeavilyCompressed, .window = 128, .head_dim = 512,
           .rate = 128, .index_heads = 0, .index_head_dim = 0, .topk = 0, .seqs = {{100000, 2, 781}}});
}

TEST_F(CudaV4KeySelectTest, CompressedSparseAroundTopK) {
  // Positions 24..39 at rate 4 see 6..10 entries: fewer than, as many as, and more than k.
  RunCase({.name = "CSA small", .type = cuda::kV4KeysCompressedSparse, .window = 4, .head_dim = 8, .rate = 4,
           .index_heads = 4, .index_head_dim = 32, .topk = 8, .seqs = {{24, 16, 10}}});
  // Two sequences with different starts; one sees fewer entries than its position allows.
  RunCase({.name = "CSA two sequences", .type = cuda::kV4KeysCompressedSparse, .window = 16, .head_dim = 64,
           .rate = 4, .index_heads = 8, .index_head_dim = 64, .topk = 16, .seqs = {{90, 12, 25}, {3, 30, 8}}});
}

TEST_F(CudaV4KeySelectTest, CompressedSparseFlashShape) {
  // V4-Flash: 64 indexer heads of 128, top 512 of ~5000 entries, a 128-position window.
  RunCase({.name = "CSA 5000", .type = cuda::kV4KeysCompressedSparse, .window = 128, .head_dim = 512, .rate = 4,
           .index_heads = 64, .index_head_dim = 128, .topk = 512, .seqs = {{19997, 3, 5000}}});
}

TEST_F(CudaV4KeySelectTest, TiesGoToTheLowerEntry) {
  // 7 distinct index keys over 300 entries: the k-th score is shared by ~40 entries. Token
  // 0's queries are zero: every score 0, the first k entries.
  RunCase({.name = "ties", .type = cuda::kV4KeysCompressedSparse, .window = 4, .head_dim = 8, .rate = 4,
           .index_heads = 4, .index_head_dim = 32, .topk = 50, .seqs = {{1200, 4, 300}}, .distinct_keys = 7,
           .zero_first_query = true});
}

TEST_F(CudaV4KeySelectTest, OverflowsAreFlaggedPerToken) {
  // max_keys fits the early tokens only (window 8 + up to 4 entries).
  RunCase({.name = "HCA overflow", .type = cuda::kV4KeysHeavilyCompressed, .window = 8, .head_dim = 16, .rate = 4,
           .index_heads = 0, .index_head_dim = 0, .topk = 0, .seqs = {{10, 10, 5}}, .max_keys = 10});
  // max_entries below the later tokens' visible counts.
  RunCase({.name = "CSA overflow", .type = cuda::kV4KeysCompressedSparse, .window = 4, .head_dim = 8, .rate = 4,
           .index_heads = 2, .index_head_dim = 16, .topk = 2, .seqs = {{20, 12, 8}}, .max_keys = 64,
           .max_entries = 6});
}

TEST_F(CudaV4KeySelectTest, BadParamsAreRefused) {
  Dev<int32_t> i(8);
  Dev<float> f(64);
  Dev<const float*> k(8);
  cuda::V4KeySelectParams p{.tokens = 1, .token_seq = i.get(), .token_pos = i.get(), .seq_start = i.get(),
                            .seq_row0 = i.get(), .seq_ring = k.get(), .chunk_kv = f.get(), .chunk_kv_stride = 8,
                            .window = 4, .head_dim = 8, .type = 3, .keys = k.get(), .num_keys = i.get(),
                            .max_keys = 8};
  EXPECT_EQ(cuda::V4KeySelect(p, nullptr), cudaErrorInvalidValue) << "type 3";
  p.type = cuda::kV4KeysHeavilyCompressed;
  EXPECT_EQ(cuda::V4KeySelect(p, nullptr), cudaErrorInvalidValue) << "HCA without entries";
  p.type = cuda::kV4KeysSliding;
  p.chunk_kv_stride = 4;
  EXPECT_EQ(cuda::V4KeySelect(p, nullptr), cudaErrorInvalidValue) << "stride below head_dim";
}

}  // namespace
}  // namespace tandem
