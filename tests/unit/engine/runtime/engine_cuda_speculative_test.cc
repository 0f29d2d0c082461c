// Speculative decoding through the engine on the CUDA backend (docs/speculative-decoding.md):
// on a make-model --mtp-acceptance checkpoint (margins of several nats, so no rounding
// flips a token) greedy outputs follow the construction's successor with drafts on and
// off, and the acceptance is the construction's; with --batch-invariant on the random tiny
// model every logprob's bits are the same with drafts on and off; a CUDA prefill engine's
// handover (KV through the host pools, the last hidden state) makes a CUDA decode engine
// draft and decode as the aggregated one. Skips, saying why, without a GPU.
#include <cstdio>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "engine/model/model_generator.h"
#include "engine/model/mtp_test_model.h"
#include "engine/runtime/engine.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/speculative_test_support.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

const std::string& ConstructedDir() {
  static testing::TempDir* tmp = new testing::TempDir();
  static const std::string dir = testing::MakeMtpTestModel(*tmp, "m", 1024, /*seed=*/5, 0.75);
  return dir;
}

std::unique_ptr<Engine> Make(const std::string& dir, int32_t drafts, EngineOptions o = {}) {
  o.device = "cuda";
  o.num_threads = 2;
  o.gpu_memory_utilization = 0.3;
  o.num_kv_blocks = 512;
  o.speculative_tokens = drafts;
  o.speculative_adaptive = false;  // every step drafts: the tests count drafts
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(dir, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using testing::Score;
using Out = testing::Scored;

std::vector<Out> RunAll(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens, int logprobs) {
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = testing::GreedyRequest(absl::StrCat("r", i), prompts[i], max_tokens);
    r.sampling.logprobs = logprobs;
    absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Out> out;
  for (auto& s : streams) out.push_back(Score(*s));
  return out;
}

class EngineCudaSpeculativeTest : public testing::GpuTest {};

TEST_F(EngineCudaSpeculativeTest, ConstructedModelFollowsItsSuccessorAtItsAcceptance) {
  const MtpTestTokens tokens = testing::MtpTestTokensOf(ConstructedDir());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(testing::Tokens(5 + 23 * i, i));
  auto plain = Make(ConstructedDir(), 0);
  auto spec_engine = Make(ConstructedDir(), 3);
  const std::vector<Out> want = RunAll(*plain, prompts, 80, 0);
  const std::vector<Out> got = RunAll(*spec_engine, prompts, 80, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
    int32_t previous = prompts[i].back();
    for (size_t j = 0; j < got[i].tokens.size(); ++j) {
      ASSERT_EQ(got[i].tokens[j], tokens.Successor(previous)) << "prompt " << i << ", token " << j;
      previous = got[i].tokens[j];
    }
  }
  const EngineStats st = spec_engine->Stats();
  int64_t steps = 0;
  for (int64_t n : st.spec_accepted_length) steps += n;
  ASSERT_EQ(st.spec_accepted_by_position.size(), 3u);
  const double first = static_cast<double>(st.spec_accepted_by_position[0]) / steps;
  const double second = static_cast<double>(st.spec_accepted_by_position[1]) / st.spec_accepted_by_position[0];
  std::printf("GPU, P 0.75: %lld verify steps; first draft accepted %.3f, second given first %.3f\n",
              static_cast<long long>(steps), first, second);
  EXPECT_NEAR(first, 0.75, 0.08);
  EXPECT_NEAR(second, 0.75, 0.12);
}

TEST_F(EngineCudaSpeculativeTest, BatchInvariantLogprobsAreTheSameWithAndWithoutDrafts) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(testing::Tokens(7 + 41 * i, i));
  auto plain = Make(testing::SmallTinyModelDir(), 0, {.batch_invariant = true});
  auto spec_engine = Make(testing::SmallTinyModelDir(), 3, {.batch_invariant = true});
  const std::vector<Out> want = RunAll(*plain, prompts, 40, 3);
  const std::vector<Out> got = RunAll(*spec_engine, prompts, 40, 3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
    EXPECT_EQ(got[i].bits, want[i].bits) << "prompt " << i;
  }
  EXPECT_GT(spec_engine->Stats().spec_draft_tokens, 0);
}

TEST_F(EngineCudaSpeculativeTest, DraftsOfConstrainedRequestsAreMaskedOnTheGpu) {
  // A grammar with one way to write the output: the masked drafts are what the masked
  // target samples.
  auto spec_engine = Make(testing::SmallTinyModelDir(), 3);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = testing::GreedyRequest(absl::StrCat("c", i), testing::Tokens(9 + i, i), 40);
    r.constraint = {.kind = OutputConstraint::Kind::kRegex, .text = "x{30}"};
    r.stop.ignore_eos = false;
    absl::StatusOr<std::shared_ptr<OutputStream>> s = spec_engine->Submit(std::move(r));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (auto& s : streams) {
    std::string text;
    RequestOutput o;
    while (s->Next(&o)) text += o.text;
    EXPECT_EQ(text, std::string(30, 'x'));
  }
  const EngineStats st = spec_engine->Stats();
  int64_t accepted = 0;
  for (int64_t n : st.spec_accepted_by_position) accepted += n;
  std::printf("GPU, forced grammar: %lld of %lld drafts accepted\n", static_cast<long long>(accepted),
              static_cast<long long>(st.spec_draft_tokens));
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_GE(accepted, st.spec_draft_tokens * 9 / 10);
}

class HostSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice& s) override {
    for (int64_t p = s.begin; p < s.end; ++p) {
      const float* e = s.Entry(p);
      entries[s.layer][p].assign(e, e + s.entry_dim);
    }
  }
  std::map<int64_t, std::map<int64_t, std::vector<float>>> entries;
};

TEST_F(EngineCudaSpeculativeTest, ADecodeEngineDraftsFromTheHandedOverStateAsTheAggregatedOne) {
  const std::vector<int32_t> prompt = testing::Tokens(150, 3);
  auto both = Make(ConstructedDir(), 3);
  const Out reference = RunAll(*both, {prompt}, 40, 0)[0];

  auto p = Make(ConstructedDir(), 3, {.max_batch_tokens = 64});
  HostSink sink;
  EngineRequest pre = testing::GreedyRequest("x", prompt, 40);
  pre.kv_sink = &sink;
  absl::StatusOr<std::shared_ptr<OutputStream>> ps = p->Submit(pre);
  ASSERT_TRUE(ps.ok()) << ps.status();
  std::vector<int32_t> first;
  std::vector<float> first_last_hidden;
  for (RequestOutput o; (*ps)->Next(&o);) {
    first.insert(first.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finished) first_last_hidden = o.last_hidden;
  }
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(static_cast<int64_t>(first_last_hidden.size()), p->config().hidden_size);
  ASSERT_EQ(static_cast<int64_t>(sink.entries.size()), p->config().num_hidden_layers + 1);

  auto d = Make(ConstructedDir(), 3);
  absl::StatusOr<std::vector<int32_t>> blocks = d->ReserveKv("x", static_cast<int32_t>(prompt.size()));
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  for (auto& [layer, positions] : sink.entries) {
    std::vector<float> flat;
    for (auto& [pos, e] : positions) flat.insert(flat.end(), e.begin(), e.end());
    ASSERT_TRUE(d->WriteKv(*blocks, layer, 0, flat).ok());
  }
  EngineRequest dec = testing::GreedyRequest("x", prompt, 40);
  dec.mtp_hidden = first_last_hidden;
  absl::StatusOr<std::shared_ptr<OutputStream>> ds = d->SubmitImported(dec, first[0]);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Out decoded = Score(**ds);
  EXPECT_EQ(decoded.tokens, reference.tokens);
  EXPECT_EQ(decoded.metrics.accepted_draft_tokens, reference.metrics.accepted_draft_tokens);
  EXPECT_EQ(decoded.metrics.draft_tokens, reference.metrics.draft_tokens);
}

}  // namespace
}  // namespace tandem
