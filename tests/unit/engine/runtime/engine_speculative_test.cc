// Speculative decoding through the engine on the CPU (docs/speculative-decoding.md): greedy
// outputs and every logprob bitwise the same with drafts on and off (batched, in chunks,
// after prefix hits, under preemption, after a handover from a prefill engine), seeded
// outputs reproducible under any batch, the acceptance counts, refusals.
#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <regex>

#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/device_sampling_cpu_backend.h"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/speculative_test_support.h"

namespace tandem {
namespace {

using testing::Drain;
using testing::Result;
using testing::Tokens;

// Every step drafts (the tests count drafts), unless a test asks for the adaptive policy.
std::unique_ptr<Engine> MakeEngine(int32_t drafts, EngineOptions o = {}, bool adaptive = false) {
  o.num_threads = 2;
  o.speculative_tokens = drafts;
  o.speculative_adaptive = adaptive;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                      std::optional<uint64_t> seed = std::nullopt) {
  EngineRequest r = testing::GreedyRequest(id, std::move(prompt), max_tokens);
  r.sampling.logprobs = 3;
  if (seed) {
    r.sampling.seed = seed;
    r.sampling.temperature = 1.0f;
    r.sampling.top_p = 0.95f;
  }
  return r;
}

using testing::RunAll;
using testing::Score;
using testing::Scored;

std::vector<EngineRequest> Mixed(int n, int max_tokens, bool seeded) {
  std::vector<EngineRequest> r;
  for (int i = 0; i < n; ++i) {
    r.push_back(Request(absl::StrCat("r", i), Tokens(3 + 37 * i % 190, i),
                        max_tokens, seeded ? std::optional<uint64_t>(1000 + i) : std::nullopt));
  }
  return r;
}

TEST(EngineSpeculativeTest, GreedyOutputsAndLogprobsAreTheSameWithAndWithoutDrafts) {
  auto plain = MakeEngine(0);
  const std::vector<Scored> want = RunAll(*plain, Mixed(8, 40, false));
  for (int32_t drafts : {1, 3}) {
    auto spec = MakeEngine(drafts);
    const std::vector<Scored> got = RunAll(*spec, Mixed(8, 40, false));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << ", " << drafts;
    const EngineStats st = spec->Stats();
    // Every step after a sequence's first drafts (the random model's MTP layer is always
    // confident enough at threshold 0): 39 verify steps at most per request.
    EXPECT_GT(st.spec_draft_tokens, 8 * 30);
    ASSERT_EQ(st.spec_accepted_by_position.size(), static_cast<size_t>(drafts));
    ASSERT_EQ(st.spec_accepted_length.size(), static_cast<size_t>(drafts + 1));
    int64_t steps = 0, accepted = 0;
    for (size_t a = 0; a < st.spec_accepted_length.size(); ++a) {
      steps += st.spec_accepted_length[a];
      accepted += static_cast<int64_t>(a) * st.spec_accepted_length[a];
    }
    int64_t by_position = 0;
    for (size_t p = 0; p < st.spec_accepted_by_position.size(); ++p) {
      by_position += st.spec_accepted_by_position[p];
      if (p > 0) {
        EXPECT_LE(st.spec_accepted_by_position[p], st.spec_accepted_by_position[p - 1]);
      }
    }
    EXPECT_EQ(accepted, by_position);
    // Each verify step checks at least one draft and at most `drafts`.
    EXPECT_LE(steps, st.spec_draft_tokens);
    EXPECT_GE(steps * drafts, st.spec_draft_tokens);
    int64_t per_request = 0;
    for (const Scored& s : got) per_request += s.metrics.accepted_draft_tokens;
    EXPECT_EQ(per_request, accepted);
  }
}

TEST(EngineSpeculativeTest, ChunksPrefixHitsAndPreemptionChangeNothing) {
  // A small step budget (prompts in chunks, decodes sharing steps with them), a second
  // round of the same prompts (prefix hits: the first chunk recomputes the last cached
  // position for its MTP slot) and a cache too small for all at once (preemption).
  auto plain = MakeEngine(0);
  const std::vector<Scored> want = RunAll(*plain, Mixed(6, 30, false));
  auto spec = MakeEngine(3, {.num_kv_blocks = 12, .max_batch_tokens = 48});
  for (int round = 0; round < 2; ++round) {
    const std::vector<Scored> got = RunAll(*spec, Mixed(6, 30, false));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << ", round " << round;
  }
  const EngineStats st = spec->Stats();
  EXPECT_GT(st.prompt_tokens_cached, 0);
  EXPECT_GT(st.preemptions, 0);
}

TEST(EngineSpeculativeTest, SeededOutputsAreTheSameWithAndWithoutDrafts) {
  // Each output position's own seeded draw decides whether its draft stands: the tokens and
  // logprobs are the ones the request has without drafts.
  auto plain = MakeEngine(0);
  auto spec = MakeEngine(3);
  const std::vector<Scored> want = RunAll(*plain, Mixed(8, 40, true));
  const std::vector<Scored> got = RunAll(*spec, Mixed(8, 40, true));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  const EngineStats st = spec->Stats();
  EXPECT_GT(st.spec_draft_tokens, 0);
}

TEST(EngineSpeculativeTest, SeededOutputsDoNotDependOnTheBatch) {
  auto spec = MakeEngine(3);
  std::vector<EngineRequest> lone;
  lone.push_back(Request("lone", Tokens(77, 5), 40, 42));
  const Scored alone = RunAll(*spec, std::move(lone))[0];
  std::vector<EngineRequest> crowd = Mixed(7, 25, true);
  crowd.push_back(Request("lone", Tokens(77, 5), 40, 42));
  const std::vector<Scored> together = RunAll(*spec, std::move(crowd));
  EXPECT_EQ(together.back(), alone);
  EXPECT_EQ(alone.tokens.size(), 40u);
}

class SequenceSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice& s) override {
    for (int64_t p = s.begin; p < s.end; ++p) {
      const float* e = s.Entry(p);
      entries[s.layer][p].assign(e, e + s.entry_dim);
    }
  }
  std::map<int64_t, std::map<int64_t, std::vector<float>>> entries;  // [layer][position]
};

TEST(EngineSpeculativeTest, ADecodeEngineDraftsFromTheHiddenStateItIsHandedAsTheAggregatedOneDoes) {
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(9)}) {
    const std::vector<int32_t> prompt = Tokens(150, 3);
    auto both = MakeEngine(3);
    std::vector<EngineRequest> one;
    one.push_back(Request("x", prompt, 30, seed));
    const Scored reference = RunAll(*both, std::move(one))[0];

    auto p = MakeEngine(3, {.max_batch_tokens = 64});
    SequenceSink sink;
    EngineRequest pre = Request("x", prompt, 30, seed);
    pre.kv_sink = &sink;
    absl::StatusOr<std::shared_ptr<OutputStream>> ps = p->Submit(pre);
    ASSERT_TRUE(ps.ok()) << ps.status();
    RequestOutput last;
    std::vector<int32_t> first;
    for (RequestOutput o; (*ps)->Next(&o);) {
      first.insert(first.end(), o.token_ids.begin(), o.token_ids.end());
      if (o.finished) last = o;
    }
    ASSERT_EQ(first.size(), 1u);
    // The MTP layer's KV came as one layer more than the model's, and the last hidden state.
    const int64_t layers = p->config().num_hidden_layers;
    ASSERT_EQ(static_cast<int64_t>(sink.entries.size()), layers + 1);
    ASSERT_EQ(static_cast<int64_t>(last.last_hidden.size()), p->config().hidden_size);

    auto d = MakeEngine(3);
    absl::StatusOr<std::vector<int32_t>> blocks = d->ReserveKv("x", static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    for (auto& [layer, positions] : sink.entries) {
      std::vector<float> flat;
      for (auto& [pos, e] : positions) flat.insert(flat.end(), e.begin(), e.end());
      ASSERT_TRUE(d->WriteKv(*blocks, layer, 0, flat).ok());
    }
    EngineRequest dec = Request("x", prompt, 30, seed);
    // Without the hidden state a drafting decode engine refuses the request.
    EXPECT_EQ(d->SubmitImported(dec, first[0]).status().code(), absl::StatusCode::kInvalidArgument);
    dec.mtp_hidden = last.last_hidden;
    absl::StatusOr<std::shared_ptr<OutputStream>> ds = d->SubmitImported(dec, first[0]);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Scored decoded = Score(**ds);  // (the first token too: emit_first_token)
    EXPECT_EQ(decoded.tokens, reference.tokens) << (seed ? "seeded" : "greedy");
    // The same drafts were made and accepted: the first one the aggregated engine's.
    EXPECT_EQ(decoded.metrics.accepted_draft_tokens, reference.metrics.accepted_draft_tokens);
    EXPECT_EQ(decoded.metrics.draft_tokens, reference.metrics.draft_tokens);
  }
}

TEST(EngineSpeculativeTest, VerificationOnTheDeviceGivesTheHostTokens) {
  // A backend that chooses tokens "on the device" (the CPU model behind ModelBackend::
  // ForwardSample): requests verify their drafts with only token ids crossing.
  EngineOptions o;
  o.backend_factory = [](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 2, .mtp = true});
    if (!m.ok()) return m.status();
    return std::make_unique<testing::DeviceSamplingCpuBackend>(std::move(*m), /*defer=*/false);
  };
  auto device = MakeEngine(3, o);
  auto plain = MakeEngine(0);
  // Greedy and seeded requests, with a repetition penalty on some (the device rows carry
  // each draft's history).
  std::vector<EngineRequest> a = Mixed(8, 30, true), b = Mixed(8, 30, true);
  for (size_t i = 0; i < a.size(); i += 2) a[i].sampling.repetition_penalty = b[i].sampling.repetition_penalty = 1.3f;
  for (size_t i = 0; i < a.size(); i += 3) {
    a[i].sampling.temperature = b[i].sampling.temperature = 0.0f;
    a[i].sampling.seed = b[i].sampling.seed = std::nullopt;
  }
  for (EngineRequest& r : a) r.sampling.logprobs = 0;
  for (EngineRequest& r : b) r.sampling.logprobs = 0;
  const std::vector<Scored> want = RunAll(*plain, std::move(a));
  const std::vector<Scored> got = RunAll(*device, std::move(b));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  const EngineStats st = device->Stats();
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_GE(st.device_sampled_tokens, st.generated_tokens - 8);  // all but the prompts' first tokens at least
}

// The CPU model behind a clock that a forward pass advances by a millisecond per token
// it computes: a verify step of 1 + 3 tokens costs 4 plain steps, which the random tiny
// model's drafts (almost never accepted) do not repay.
class TimedBackend : public ModelBackend {
 public:
  TimedBackend(std::unique_ptr<DeepseekModel> model, std::shared_ptr<std::atomic<int64_t>> micros)
      : cpu_(std::move(model)), micros_(std::move(micros)) {}
  const ModelInfo& config() const override { return cpu_.config(); }
  std::string device_name() const override { return "cpu (timed)"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    for (const ForwardSequence& s : batch) *micros_ += 1000 * static_cast<int64_t>(s.tokens.size());
    return cpu_.Forward(batch, host, options);
  }
  bool has_mtp() const override { return cpu_.has_mtp(); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& host) override {
    return cpu_.Draft(batch, host);
  }
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const override { return cpu_.KeptHidden(row); }

 private:
  CpuBackend cpu_;
  std::shared_ptr<std::atomic<int64_t>> micros_;
};

TEST(EngineSpeculativeTest, TheAdaptivePolicyStopsDraftingWhereItDoesNotPay) {
  auto micros = std::make_shared<std::atomic<int64_t>>(0);
  EngineOptions o;
  o.clock = [micros] { return static_cast<double>(micros->load()) * 1e-6; };
  o.backend_factory = [micros](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
    absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 2, .mtp = true});
    if (!m.ok()) return m.status();
    return std::make_unique<TimedBackend>(std::move(*m), micros);
  };
  auto adaptive = MakeEngine(3, o, /*adaptive=*/true);
  auto plain = MakeEngine(0);
  std::vector<EngineRequest> one;
  one.push_back(Request("x", Tokens(20, 1), 400));
  const Scored want = RunAll(*plain, one)[0];
  const Scored got = RunAll(*adaptive, std::move(one))[0];
  EXPECT_EQ(got, want);  // drafting or not, the same tokens
  // 8 warm-up steps with drafts, then one exploration phase of 8 in 256 steps.
  const EngineStats st = adaptive->Stats();
  int64_t verify_steps = 0;
  for (int64_t n : st.spec_accepted_length) verify_steps += n;
  std::printf("adaptive: %lld verify steps in 400 tokens\n", static_cast<long long>(verify_steps));
  EXPECT_LE(verify_steps, 8 + 2 * 8 + 2);
  EXPECT_GE(verify_steps, 8);
}

TEST(EngineSpeculativeTest, ConstrainedRequestsDraftAndGiveTheirUndraftedOutputs) {
  // A draft the grammar refuses is never the token the masked row samples: refused. The
  // outputs, greedy and seeded, are the constrained requests' without drafts.
  auto plain = MakeEngine(0);
  auto spec = MakeEngine(3);
  const std::string pattern = "[a-z]{3,8}( [a-z]{3,8}){2,5}\\.";
  auto requests = [&] {
    std::vector<EngineRequest> r = Mixed(6, 60, true);
    for (size_t i = 0; i < r.size(); ++i) {
      r[i].constraint = {.kind = OutputConstraint::Kind::kRegex, .text = pattern};
      r[i].stop.ignore_eos = false;
      if (i % 2 == 0) r[i].sampling.temperature = 0.0f;
    }
    return r;
  };
  const std::vector<Scored> want = RunAll(*plain, requests());
  const std::vector<Scored> got = RunAll(*spec, requests());
  const std::regex re(pattern);
  int complete = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "request " << i;
    if (got[i].finish == FinishReason::kLength) continue;  // cut short: a prefix
    ++complete;
    EXPECT_TRUE(std::regex_match(got[i].text, re)) << "request " << i << ": '" << got[i].text << "'";
  }
  EXPECT_GE(complete, 3);
  EXPECT_GT(spec->Stats().spec_draft_tokens, 0);
}

TEST(EngineSpeculativeTest, DraftsOfConstrainedRequestsAreMaskedByTheirGrammar) {
  // A grammar that leaves one way to write the output: the masked drafts are what the
  // masked target samples, so nearly every draft stands (unmasked, the random model's MTP
  // layer would almost never draft an allowed token).
  auto spec = MakeEngine(3);
  std::vector<EngineRequest> r = Mixed(4, 40, false);
  for (EngineRequest& q : r) {
    q.constraint = {.kind = OutputConstraint::Kind::kRegex, .text = "x{30}"};
    q.stop.ignore_eos = false;
    q.sampling.logprobs = 0;
  }
  const std::vector<Scored> got = RunAll(*spec, std::move(r));
  for (const Scored& s : got) EXPECT_EQ(s.text, std::string(30, 'x'));
  const EngineStats st = spec->Stats();
  int64_t accepted = 0;
  for (int64_t n : st.spec_accepted_by_position) accepted += n;
  std::printf("forced grammar: %lld of %lld drafts accepted\n", static_cast<long long>(accepted),
              static_cast<long long>(st.spec_draft_tokens));
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_GE(accepted, st.spec_draft_tokens * 9 / 10);
}

TEST(EngineSpeculativeTest, BadOptionsAreRefused) {
  EXPECT_EQ(Engine::Create(testing::SmallTinyModelDir(), {.speculative_tokens = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::Create(testing::SmallTinyModelDir(), {.speculative_tokens = kMaxSpeculativeTokens + 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::Create(testing::SmallTinyModelDir(), {.speculative_tokens = 2, .speculative_min_confidence = 1.5f})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The drafting engine's KV holds the MTP layer's: another layout, another fingerprint.
  auto plain = MakeEngine(0);
  auto spec = MakeEngine(2);
  EXPECT_NE(plain->layout_fingerprint(), spec->layout_fingerprint());
  EXPECT_EQ(spec->kv_layout().num_layers, plain->kv_layout().num_layers + 1);
}

}  // namespace
}  // namespace tandem
