// Every position's latent KV and logits come out bitwise the same however the CPU forward
// pass reaches it: one decode step at a time, the whole sequence in one prefill pass, in
// chunks of any size, batched with other sequences, after a cached prefix, with any
// number of threads. A migrated or preempted request is re-prefilled (prompt + the tokens
// already sent) where the undisturbed run decoded: a seeded draw continues exactly only if
// the re-prefill reproduces the decode's numbers to the bit, not merely closely.
#include <cstring>
#include <numeric>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;

constexpr int64_t kVocab = 512;
constexpr int kLength = 150;  // three cache blocks, the last one partial

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + salt * 101 + 11) % (kVocab - 3) + 3;
  return p;
}

// Logits of every position and the latent KV of every position and layer, of one sequence.
struct Computed {
  std::vector<float> logits;  // [position][vocab]
  std::vector<float> kv;      // [layer][position][entry_dim]
};

// One sequence in a step: which of its tokens go in (`begin`, `count`).
struct Piece {
  int seq = 0;
  int begin = 0;
  int count = 0;
};

// Runs steps of pieces over `seqs` (each its own blocks of one cache) and returns what
// each sequence computed. Pieces of one sequence come in order; a step's pieces are one
// batch (at most one piece per sequence).
std::vector<Computed> RunSteps(DeepseekModel& m, const std::vector<std::vector<int32_t>>& seqs,
                          const std::vector<std::vector<Piece>>& steps) {
  const int64_t blocks_per_seq = (kLength + kKvBlockSize - 1) / kKvBlockSize;
  LatentKvCache cache = m.MakeKvCache(blocks_per_seq * static_cast<int64_t>(seqs.size()));
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    // Interleaved, reversed block ids: the layout must not matter either.
    for (int64_t b = 0; b < blocks_per_seq; ++b) {
      tables[s].push_back(static_cast<int32_t>((blocks_per_seq - 1 - b) * seqs.size() + s));
    }
  }
  const int64_t vocab = m.config().vocab_size;
  std::vector<Computed> out(seqs.size());
  for (Computed& c : out) c.logits.assign(static_cast<size_t>(kLength * vocab), 0.0f);
  for (const std::vector<Piece>& step : steps) {
    std::vector<ForwardSequence> batch;
    for (const Piece& p : step) {
      batch.push_back({.tokens = std::span<const int32_t>(seqs[p.seq].data() + p.begin, p.count),
                       .start_position = p.begin,
                       .block_table = tables[p.seq],
                       .all_logits = true});
    }
    absl::StatusOr<std::vector<float>> logits = m.Forward(batch, cache);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
    int64_t row = 0;
    for (const Piece& p : step) {
      std::memcpy(&out[p.seq].logits[p.begin * vocab], logits->data() + row * vocab, p.count * vocab * sizeof(float));
      row += p.count;
    }
  }
  const int64_t dim = cache.entry_dim();
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t l = 0; l < cache.num_layers(); ++l) {
      for (int64_t pos = 0; pos < kLength; ++pos) {
        const float* e = cache.Entry(l, tables[s], pos);
        out[s].kv.insert(out[s].kv.end(), e, e + dim);
      }
    }
  }
  return out;
}

// Number of floats whose bits differ (0 when bitwise identical).
int64_t BitsDiffer(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Steps that feed sequence `seq` in pieces of the given sizes (cycled) up to kLength.
std::vector<std::vector<Piece>> Chunked(int seq, const std::vector<int>& sizes) {
  std::vector<std::vector<Piece>> steps;
  for (int pos = 0, i = 0; pos < kLength; ++i) {
    const int n = std::min(sizes[i % sizes.size()], kLength - pos);
    steps.push_back({{.seq = seq, .begin = pos, .count = n}});
    pos += n;
  }
  return steps;
}

class PathInvarianceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    nlohmann::json j = nlohmann::json::parse(PresetJson(GetParam()));
    j["vocab_size"] = kVocab;
    dir_ = MakeModel(tmp_, GetParam(), j.dump());
    model_ = Load(2);
    ASSERT_NE(model_, nullptr);
  }
  std::unique_ptr<DeepseekModel> Load(int threads) {
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir_, {.num_threads = threads});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  // The undisturbed run of a served request: the prompt in one prefill pass, then one
  // decode step per generated token.
  Computed Decoded(DeepseekModel& m, const std::vector<int32_t>& tokens, int prompt_len) {
    std::vector<std::vector<Piece>> steps = {{{.seq = 0, .begin = 0, .count = prompt_len}}};
    for (int pos = prompt_len; pos < kLength; ++pos) steps.push_back({{.seq = 0, .begin = pos, .count = 1}});
    return RunSteps(m, {tokens}, steps)[0];
  }
  void ExpectSame(const Computed& got, const Computed& want, const std::string& path) {
    EXPECT_EQ(BitsDiffer(got.kv, want.kv), 0) << path << ": latent KV entries differ from the decoded run's";
    EXPECT_EQ(BitsDiffer(got.logits, want.logits), 0) << path << ": logits differ from the decoded run's";
  }

  TempDir tmp_;
  std::string dir_;
  std::unique_ptr<DeepseekModel> model_;
};

TEST_P(PathInvarianceTest, ReprefillAfterDecodeIsBitwiseTheDecodedRun) {
  const std::vector<int32_t> tokens = Tokens(kLength, 1);
  const Computed decoded = Decoded(*model_, tokens, 40);
  // A migration's re-prefill: prompt + the 110 tokens sent, in one pass.
  ExpectSame(RunSteps(*model_, {tokens}, Chunked(0, {kLength}))[0], decoded, "one prefill pass");
  // ... or with the prompt alone first, then the resumed tokens in one chunk.
  ExpectSame(RunSteps(*model_, {tokens}, Chunked(0, {40, kLength}))[0], decoded, "prompt, then resumed tokens");
  // Chunked prefill at sizes that cross block boundaries anywhere, single tokens included.
  ExpectSame(RunSteps(*model_, {tokens}, Chunked(0, {7, 1, 64, 13, 2}))[0], decoded, "chunks 7,1,64,13,2");
  // Every position a decode step.
  ExpectSame(RunSteps(*model_, {tokens}, Chunked(0, {1}))[0], decoded, "decode from the first token");
}

TEST_P(PathInvarianceTest, BatchCompositionAndThreadsDoNotChangeABit) {
  const std::vector<int32_t> a = Tokens(kLength, 1), b = Tokens(kLength, 2), c = Tokens(kLength, 3);
  const Computed decoded = Decoded(*model_, a, 40);
  // a decodes while b prefills in chunks and c arrives halfway, all in the same batches.
  std::vector<std::vector<Piece>> steps = {{{.seq = 0, .begin = 0, .count = 40}, {.seq = 1, .begin = 0, .count = 30}}};
  int b_pos = 30, c_pos = 0;
  for (int pos = 40; pos < kLength; ++pos) {
    std::vector<Piece> step = {{.seq = 0, .begin = pos, .count = 1}};
    if (b_pos < kLength) {
      const int n = std::min(17, kLength - b_pos);
      step.push_back({.seq = 1, .begin = b_pos, .count = n});
      b_pos += n;
    }
    if (pos >= 95 && c_pos < kLength) {
      const int n = c_pos == 0 ? 90 : 1;
      step.push_back({.seq = 2, .begin = c_pos, .count = n});
      c_pos += n;
    }
    steps.push_back(step);
  }
  std::vector<std::vector<Piece>> rest;
  while (c_pos < kLength) {
    rest.push_back({{.seq = 2, .begin = c_pos, .count = 1}});
    ++c_pos;
  }
  steps.insert(steps.end(), rest.begin(), rest.end());
  const std::vector<Computed> together = RunSteps(*model_, {a, b, c}, steps);
  ASSERT_EQ(together.size(), 3u);
  ExpectSame(together[0], decoded, "decoded in a mixed batch");
  ExpectSame(together[1], RunSteps(*model_, {b}, Chunked(0, {kLength}))[0], "b: chunks of 17 in a batch vs alone");
  ExpectSame(together[2], Decoded(*model_, c, 90), "c: prefilled and decoded in a batch vs alone");

  // One thread (a prefill replica configured differently) against two.
  std::unique_ptr<DeepseekModel> one = Load(1);
  ASSERT_NE(one, nullptr);
  ExpectSame(RunSteps(*one, {a}, Chunked(0, {kLength}))[0], decoded, "one thread, one pass");
}

TEST_P(PathInvarianceTest, CachedPrefixThenPrefillEqualsComputingItAll) {
  // A prefix cache hit: the first two blocks' KV computed by an earlier request (which
  // decoded part of them) and the rest prefilled on top, against one request doing it all.
  const std::vector<int32_t> tokens = Tokens(kLength, 4);
  const Computed decoded = Decoded(*model_, tokens, 100);
  std::vector<std::vector<Piece>> steps = {{{.seq = 0, .begin = 0, .count = 70}}};
  for (int pos = 70; pos < 128; ++pos) steps.push_back({{.seq = 0, .begin = pos, .count = 1}});
  steps.push_back({{.seq = 0, .begin = 128, .count = kLength - 128}});
  ExpectSame(RunSteps(*model_, {tokens}, steps)[0], decoded, "cached 128-token prefix, then a 22-token prefill");
}

INSTANTIATE_TEST_SUITE_P(Presets, PathInvarianceTest, ::testing::Values("tiny", "tiny-v2"));

}  // namespace
}  // namespace tandem
