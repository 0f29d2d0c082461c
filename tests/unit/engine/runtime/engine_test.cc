// The engine as the services use it: continuous batching, prefix reuse, disaggregated
// prefill/decode through KV export and import, preemption, cancellation, and every exit
// path returning its KV blocks.
#include "engine/runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/device_sampling_cpu_backend.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;
using testing::Tokens;

// One generated tiny model shared by the whole test binary.
const std::string& ModelDir() { return testing::SmallTinyModelDir(); }

// The engines a test makes: the CPU backend (tokens sampled on the host, one step at a
// time), or a CPU backend that samples "on the device" and computes each launched step
// only when the engine collects it (the engine's pipelined steps, as on a GPU).
enum class Backend { kCpu, kPipelined };
Backend g_backend = Backend::kCpu;

std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) {
  if (o.num_threads == 0) o.num_threads = 2;
  if (g_backend == Backend::kPipelined && !o.backend_factory) {
    o.backend_factory = [threads = o.num_threads](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = threads});
      if (!m.ok()) return m.status();
      return std::make_unique<testing::DeviceSamplingCpuBackend>(std::move(*m), /*defer=*/true);
    };
  }
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(ModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class EngineTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { g_backend = GetParam(); }
  void TearDown() override { g_backend = Backend::kCpu; }
};

using testing::Drain;
using testing::Result;
using testing::ReserveWithToken;

EngineRequest Req(const std::string& id, std::vector<int32_t> prompt, int max_tokens, std::optional<uint64_t> seed,
                  float temperature = 0.8f) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling.temperature = temperature;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

Result RunToEnd(Engine& e, EngineRequest r) {
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? Drain(**s) : Result{};
}

void ExpectNoBlocksInUse(Engine& e) {
  // Stats are published after each loop iteration; give the thread a moment.
  for (int i = 0; i < 200 && e.Stats().kv_blocks_in_use != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(e.Stats().kv_blocks_in_use, 0);
}

TEST(EngineOptionsTest, StepSizeDefaultsByDevice) {
  // EngineOptions::max_batch_tokens 0 takes these (a GPU prefills long chunks cheaply).
  EXPECT_EQ(DefaultMaxBatchTokens("cuda"), 8192);
  EXPECT_EQ(DefaultMaxBatchTokens("cuda:3"), 8192);
  EXPECT_EQ(DefaultMaxBatchTokens("cpu"), 2048);
  EXPECT_EQ(EngineOptions{}.max_batch_tokens, 0);
}

TEST_P(EngineTest, SeededRequestIsBatchIndependent) {
  auto alone_engine = MakeEngine();
  const EngineRequest target = Req("target", Tokens(90, 1), 24, 1234);
  const Result alone = RunToEnd(*alone_engine, target);
  ASSERT_EQ(alone.tokens.size(), 24u);

  // The same request among 16 mixed ones: different lengths, sampling parameters and
  // arrival times, a small step budget so prefill chunks mix with decodes.
  auto busy = MakeEngine({.max_batch_tokens = 48});
  std::vector<std::shared_ptr<OutputStream>> others;
  std::mt19937 rng(5);
  for (int i = 0; i < 16; ++i) {
    if (i == 6) {
      auto s = busy->Submit(target);
      ASSERT_TRUE(s.ok()) << s.status();
      others.push_back(*s);
      continue;
    }
    EngineRequest r = Req("r" + std::to_string(i), Tokens(5 + static_cast<int>(rng() % 150), 100 + i),
                          4 + static_cast<int>(rng() % 30), i % 3 == 0 ? std::nullopt : std::optional<uint64_t>(i),
                          i % 4 == 0 ? 0.0f : 0.5f + 0.1f * (i % 5));
    r.sampling.top_k = i % 2 ? 50 : 0;
    r.sampling.repetition_penalty = i % 5 == 0 ? 1.2f : 1.0f;
    auto s = busy->Submit(std::move(r));
    ASSERT_TRUE(s.ok()) << s.status();
    others.push_back(*s);
    if (i % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // staggered arrivals
  }
  std::vector<Result> results;
  for (auto& s : others) results.push_back(Drain(*s));
  EXPECT_EQ(results[6].tokens, alone.tokens);
  EXPECT_EQ(results[6].text, alone.text);
  for (const Result& r : results) EXPECT_TRUE(r.final.status.ok()) << r.final.status;
  ExpectNoBlocksInUse(*busy);
}

TEST_P(EngineTest, SharedPrefixIsReusedWithIdenticalOutput) {
  const std::vector<int32_t> prefix = Tokens(512, 2);
  std::vector<int32_t> p1 = prefix, p2 = prefix;
  const std::vector<int32_t> s1 = Tokens(40, 3), s2 = Tokens(37, 4);
  p1.insert(p1.end(), s1.begin(), s1.end());
  p2.insert(p2.end(), s2.begin(), s2.end());
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(99)}) {
    const float temperature = seed ? 0.9f : 0.0f;
    auto warm = MakeEngine();
    const Result first = RunToEnd(*warm, Req("a", p1, 8, seed, temperature));
    EXPECT_EQ(first.final.metrics.cached_prompt_tokens, 0);
    const Result second = RunToEnd(*warm, Req("b", p2, 16, seed, temperature));
    EXPECT_EQ(second.final.metrics.cached_prompt_tokens, 512);
    EXPECT_EQ(second.final.metrics.computed_prompt_tokens, static_cast<int32_t>(p2.size()) - 512);
    EXPECT_EQ(warm->Stats().prompt_tokens_cached, 512);

    auto cold = MakeEngine({.enable_prefix_cache = false});
    const Result reference = RunToEnd(*cold, Req("b", p2, 16, seed, temperature));
    EXPECT_EQ(reference.final.metrics.computed_prompt_tokens, static_cast<int32_t>(p2.size()));
    EXPECT_EQ(second.tokens, reference.tokens) << (seed ? "seeded" : "greedy");
  }
}

// The KV of generated tokens is reused by a later request whose prompt continues them (a
// conversation's next turn): their blocks are hashed with the tokens' values, also with
// pipelined steps, where a block may fill up with the placeholder of a token still being
// chosen when the token before it is emitted.
TEST_P(EngineTest, GeneratedTokensAreReusedByTheNextTurn) {
  auto e = MakeEngine({.max_batch_tokens = 256});
  for (const int prompt_len : {10, 63, 64}) {
    const std::vector<int32_t> prompt = Tokens(prompt_len, prompt_len);
    const Result first = RunToEnd(*e, Req("turn1-" + std::to_string(prompt_len), prompt, 150, std::nullopt, 0.0f));
    ASSERT_EQ(first.tokens.size(), 150u);
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), first.tokens.begin(), first.tokens.end());
    next.push_back(5);
    // Full blocks before the last token; the last one holds the first turn's last token,
    // whose KV was never computed.
    const int32_t reusable = static_cast<int32_t>((prompt_len + 150 - 1) / 64 * 64);
    const Result second = RunToEnd(*e, Req("turn2-" + std::to_string(prompt_len), next, 4, std::nullopt, 0.0f));
    EXPECT_EQ(second.final.metrics.cached_prompt_tokens, reusable) << "prompt of " << prompt_len;
  }
}

// Collects exported KV: layer -> position -> entry. Checks the order the engine promises
// (kv_sink.h): each step hands over one range of positions for layer 0, 1, ... in turn,
// and the next step's range starts where the previous one ended (the first at 0, cached
// positions included), so a receiver can stream the layers as they come.
class CollectingSink : public KvSink {
 public:
  void OnLayerKv(const KvSlice& s) override {
    if (s.layer == 0) {
      EXPECT_TRUE(last_layer_ == -1 || last_layer_ == layers_seen_ - 1)
          << "a new step began after layer " << last_layer_ << " of " << layers_seen_;
      EXPECT_EQ(s.begin, step_end_) << "the step's positions do not continue the previous step's";
      step_begin_ = s.begin;
      step_end_ = s.end;
    } else {
      EXPECT_EQ(s.layer, last_layer_ + 1) << "layers out of order within a step";
      EXPECT_EQ(s.begin, step_begin_) << "layer " << s.layer << " covers other positions than layer 0";
      EXPECT_EQ(s.end, step_end_) << "layer " << s.layer << " covers other positions than layer 0";
    }
    EXPECT_LT(s.begin, s.end) << "an empty slice";
    for (int64_t p = s.begin; p < s.end; ++p) {
      const float* e = s.Entry(p);
      entries_[s.layer][p].assign(e, e + s.entry_dim);
    }
    ++calls_;
    last_layer_ = s.layer;
    layers_seen_ = std::max(layers_seen_, s.layer + 1);
  }
  std::map<int64_t, std::map<int64_t, std::vector<float>>> entries_;
  int calls_ = 0;
  int64_t last_layer_ = -1;
  int64_t layers_seen_ = 0;  // layers of the first step (every step has them all)
  int64_t step_begin_ = 0;
  int64_t step_end_ = 0;  // the current step's end: where the next step must begin
};

TEST_P(EngineTest, PrefillExportThenImportedDecodeMatchesOneEngine) {
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(7)}) {
    const float temperature = seed ? 0.7f : 0.0f;
    const std::vector<int32_t> prompt = Tokens(150, 9);
    auto single = MakeEngine();
    const Result reference = RunToEnd(*single, Req("x", prompt, 20, seed, temperature));

    // Prefill on engine P, in chunks (small step budget), with a warm prefix cache so the
    // export must also cover positions P did not compute.
    auto p = MakeEngine({.max_batch_tokens = 64});
    RunToEnd(*p, Req("warmup", std::vector<int32_t>(prompt.begin(), prompt.begin() + 130), 1, seed, temperature));
    CollectingSink sink;
    EngineRequest pre = Req("x", prompt, 20, seed, temperature);
    pre.kv_sink = &sink;
    auto ps = p->Submit(pre);
    ASSERT_TRUE(ps.ok()) << ps.status();
    const Result prefilled = Drain(**ps);
    ASSERT_EQ(prefilled.tokens.size(), 1u);
    EXPECT_EQ(prefilled.final.metrics.cached_prompt_tokens, 128);
    EXPECT_EQ(prefilled.tokens[0], reference.tokens[0]);
    const int64_t layers = p->config().num_hidden_layers;
    ASSERT_EQ(static_cast<int64_t>(sink.entries_.size()), layers);
    for (auto& [layer, positions] : sink.entries_) ASSERT_EQ(positions.size(), prompt.size()) << layer;
    EXPECT_EQ(sink.calls_ % layers, 0);
    EXPECT_EQ(sink.layers_seen_, layers);
    EXPECT_EQ(sink.last_layer_, layers - 1) << "the last step stopped before the last layer";
    EXPECT_EQ(sink.step_end_, static_cast<int64_t>(prompt.size()));

    // Decode on engine D from the imported KV.
    auto d = MakeEngine();
    absl::StatusOr<std::vector<int32_t>> blocks = d->ReserveKv("x", static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    for (auto& [layer, positions] : sink.entries_) {
      std::vector<float> flat;
      for (auto& [pos, e] : positions) flat.insert(flat.end(), e.begin(), e.end());
      ASSERT_TRUE(d->WriteKv(*blocks, layer, 0, flat).ok());
    }
    auto ds = d->SubmitImported(Req("x", prompt, 20, seed, temperature), prefilled.tokens[0]);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Result decoded = Drain(**ds);
    EXPECT_EQ(decoded.tokens, reference.tokens) << (seed ? "seeded" : "greedy");
    EXPECT_EQ(decoded.text, reference.text);
    ExpectNoBlocksInUse(*d);
    ExpectNoBlocksInUse(*p);
  }
}

absl::Status BeginWrites(Engine& e, const std::string& id, uint64_t token, const KvWriter& w) {
  std::promise<absl::Status> p;
  e.BeginKvWrites(id, token, w, [&p](absl::Status s) { p.set_value(std::move(s)); });
  return p.get_future().get();
}

// A stat as the engine publishes it after each loop iteration, polled until it reads
// `want` (a number of tries: the engine thread's progress, not a clock bound).
int64_t StatBecomes(Engine& e, int64_t EngineStats::*field, int64_t want) {
  int64_t v = 0;
  for (int i = 0; i < 400 && (v = e.Stats().*field) != want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return v;
}

TEST_P(EngineTest, ImportWithoutReservationFailsAndLeasesEndOnProofOnly) {
  std::atomic<double> now{1000.0};
  auto e = MakeEngine({.kv_lease_seconds = 5.0, .kv_quarantine_stuck_seconds = 20.0, .clock = [&now] { return now.load(); }});
  auto s = e->SubmitImported(Req("nope", Tokens(10, 1), 4, 1), 5);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  const KvWriter w{.address = "127.0.0.1:1", .incarnation = 77};

  // No writer began on it: the expiry frees it at once.
  ASSERT_TRUE(e->ReserveKv("idle", 100).ok());
  EXPECT_EQ(e->ReserveKv("idle", 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_blocks_in_use, 2), 2);
  now = 1006.0;
  e->Cancel("unrelated");  // wakes the engine thread
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_quarantine_ends_no_writer, 1), 1);
  ExpectNoBlocksInUse(*e);
  EXPECT_EQ(BeginWrites(*e, "idle", 1, w).code(), absl::StatusCode::kFailedPrecondition);

  // A writer began: expired, it is quarantined, and no time frees it.
  const KvLeases::Reservation lease = ReserveWithToken(*e, "lease", 100);
  ASSERT_TRUE(BeginWrites(*e, "lease", lease.token, w).ok());
  now = 1012.0;
  e->Cancel("unrelated");
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_blocks_quarantined, 2), 2);
  EXPECT_EQ(e->Stats().kv_leases_expired, 2);
  EXPECT_EQ(e->SubmitImported(Req("lease", Tokens(100, 1), 4, 1), 5).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->ReserveKv("lease", 100).status().code(), absl::StatusCode::kInvalidArgument);
  now = 1000.0 + 1e6;
  e->Cancel("unrelated");
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_quarantine_stuck, 1), 1);
  EXPECT_EQ(e->Stats().kv_blocks_quarantined, 2);
  EXPECT_EQ(e->Stats().kv_blocks_in_use, 2);
  // The writer's EndWrites frees it.
  e->EndKvWrites("lease", lease.token, w.incarnation);
  ExpectNoBlocksInUse(*e);
  EXPECT_EQ(e->Stats().kv_quarantine_ends_writer_ended, 1);

  // A Release (Cancel) while the writer may write quarantines; the proof of its answered
  // prefill (ReleaseKv with its incarnation) frees. A writer gone frees too.
  const KvLeases::Reservation second = ReserveWithToken(*e, "second", 100);
  const KvLeases::Reservation third = ReserveWithToken(*e, "third", 100);
  ASSERT_TRUE(BeginWrites(*e, "second", second.token, w).ok());
  ASSERT_TRUE(BeginWrites(*e, "third", third.token, w).ok());
  e->Cancel("second");
  e->Cancel("third");
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_blocks_quarantined, 4), 4);
  e->ReleaseKv("second", w.incarnation);
  e->KvWriterStopped("third", third.token, w.incarnation, KvWriterProof::kGone);
  ExpectNoBlocksInUse(*e);
  EXPECT_EQ(e->Stats().kv_quarantine_ends_decoded, 1);
  EXPECT_EQ(e->Stats().kv_quarantine_ends_writer_gone, 1);
  EXPECT_EQ(e->Stats().kv_blocks_quarantined, 0);
}

TEST_P(EngineTest, PreemptionUnderKvPressureKeepsOutputsIdentical) {
  std::vector<EngineRequest> reqs;
  // Each sequence grows to ~4 blocks; any three running at once exhaust the 8 blocks.
  for (int i = 0; i < 6; ++i) reqs.push_back(Req("q" + std::to_string(i), Tokens(60 + 10 * i, 20 + i), 150, 100 + i));
  auto roomy = MakeEngine();
  std::vector<Result> expected;
  for (const auto& r : reqs) expected.push_back(RunToEnd(*roomy, r));

  // 8 blocks of 64 tokens: six sequences growing past 200 tokens cannot all stay.
  auto tight = MakeEngine({.num_kv_blocks = 8});
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (const auto& r : reqs) {
    auto s = tight->Submit(r);
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    const Result got = Drain(*streams[i]);
    EXPECT_TRUE(got.final.status.ok()) << got.final.status;
    EXPECT_EQ(got.tokens, expected[i].tokens) << i;
    EXPECT_EQ(got.text, expected[i].text) << i;
  }
  EXPECT_GT(tight->Stats().preemptions, 0);
  ExpectNoBlocksInUse(*tight);
}

TEST_P(EngineTest, ThousandRequestsWithCancellationsAndStopsFreeEveryBlock) {
  auto e = MakeEngine({.num_kv_blocks = 24, .max_batch_tokens = 256, .max_running = 16});
  std::mt19937 rng(11);
  std::vector<std::pair<std::string, std::shared_ptr<OutputStream>>> live;
  int finished = 0, cancelled = 0, stopped = 0;
  auto drain_some = [&](size_t keep) {
    while (live.size() > keep) {
      Result r = Drain(*live.front().second);
      EXPECT_TRUE(r.final.finished);
      if (r.final.status.code() == absl::StatusCode::kCancelled) ++cancelled;
      else EXPECT_TRUE(r.final.status.ok()) << r.final.status;
      if (r.final.finish_reason == FinishReason::kStop) ++stopped;
      ++finished;
      live.erase(live.begin());
    }
  };
  for (int i = 0; i < 1000; ++i) {
    EngineRequest r = Req("r" + std::to_string(i), Tokens(1 + static_cast<int>(rng() % 120), i),
                          1 + static_cast<int>(rng() % 12), rng() % 2 ? std::optional<uint64_t>(i) : std::nullopt,
                          rng() % 3 == 0 ? 0.0f : 1.0f);
    r.stop.ignore_eos = rng() % 2 == 0;
    if (rng() % 4 == 0) r.stop.stop = {"e", "a"};
    if (rng() % 5 == 0) r.stop.stop_token_ids = {static_cast<int32_t>(3 + rng() % 1000)};
    auto s = e->Submit(std::move(r));
    ASSERT_TRUE(s.ok()) << s.status();
    live.emplace_back("r" + std::to_string(i), *s);
    if (rng() % 4 == 0) e->Cancel(live[rng() % live.size()].first);
    drain_some(24);
  }
  drain_some(0);
  EXPECT_EQ(finished, 1000);
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(stopped, 0);
  ExpectNoBlocksInUse(*e);
  EXPECT_EQ(e->Stats().num_running + e->Stats().num_waiting, 0);
}

TEST_P(EngineTest, StopStringAcrossTokensIsCutAndNotEmitted) {
  auto e = MakeEngine();
  const std::vector<int32_t> prompt = Tokens(30, 5);
  const Result free_run = RunToEnd(*e, Req("free", prompt, 40, std::nullopt, 0.0f));
  // A stop string made of the end of one generated token and the start of the next.
  std::string chosen;
  size_t cut = 0;
  for (size_t i = 3; i + 1 < free_run.tokens.size() && chosen.empty(); ++i) {
    const std::string a = e->tokenizer().Decode(std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + i), true);
    const std::string b = e->tokenizer().Decode(std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + i + 1), true);
    const auto printable = [](const std::string& x) {
      return std::all_of(x.begin(), x.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; });
    };
    if (a.size() >= 2 && b.size() >= a.size() + 2 && printable(b.substr(a.size() - 2, 4)) &&
        free_run.text.find(b.substr(a.size() - 2, 4)) == a.size() - 2) {
      chosen = b.substr(a.size() - 2, 4);
      cut = a.size() - 2;
    }
  }
  ASSERT_FALSE(chosen.empty()) << "no suitable stop string in: " << free_run.text;
  EngineRequest r = Req("stopped", prompt, 40, std::nullopt, 0.0f);
  r.stop.stop = {chosen};
  const Result stopped = RunToEnd(*e, r);
  EXPECT_EQ(stopped.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.final.matched_stop, chosen);
  EXPECT_EQ(stopped.text, free_run.text.substr(0, cut));
}

TEST_P(EngineTest, EdgeCasesAreClear) {
  auto e = MakeEngine({.max_waiting = 2});
  // max_tokens = 1
  const Result one = RunToEnd(*e, Req("one", Tokens(10, 1), 1, 3));
  EXPECT_EQ(one.tokens.size(), 1u);
  EXPECT_EQ(one.final.finish_reason, FinishReason::kLength);
  EXPECT_GT(one.final.metrics.ttft_s, 0.0);
  // Empty prompt.
  auto empty = e->Submit(Req("empty", {}, 4, 1));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(empty.status().message()).find("prompt"), std::string::npos);
  // Longer than the context (4096 for tiny).
  auto huge = e->Submit(Req("huge", Tokens(5000, 1), 4, 1));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(huge.status().message()).find("context"), std::string::npos) << huge.status();
  // Token outside the vocabulary; NaN temperature.
  EXPECT_EQ(e->Submit(Req("oov", {5, 2000}, 4, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  EngineRequest nan = Req("nan", Tokens(5, 1), 4, 1);
  nan.sampling.temperature = std::nanf("");
  EXPECT_EQ(e->Submit(nan).status().code(), absl::StatusCode::kInvalidArgument);
  // Cancel a long request.
  auto longer = e->Submit(Req("long", Tokens(20, 1), 2000, 1));
  ASSERT_TRUE(longer.ok());
  e->Cancel("long");
  const Result cancelled = Drain(**longer);
  EXPECT_EQ(cancelled.final.status.code(), absl::StatusCode::kCancelled);
  // Duplicate id while live.
  auto a = e->Submit(Req("dup", Tokens(20, 1), 500, 1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(e->Submit(Req("dup", Tokens(20, 1), 5, 1)).status().code(), absl::StatusCode::kInvalidArgument);
  e->Cancel("dup");
  Drain(**a);
  ExpectNoBlocksInUse(*e);
}

// max_tokens bounds what is emitted and what is counted, with every step pipelined (the
// engine launches the next step, placeholders of the sequences' coming tokens included,
// before it emits this step's tokens and sees which sequences end): several prompts
// decoding together, small odd budgets, EOS ignored. completion_tokens is the number of
// tokens streamed, also for a request cancelled while a step computes its next token.
TEST_P(EngineTest, MaxTokensBoundsWhatIsEmittedAndCounted) {
  auto e = MakeEngine({.max_batch_tokens = 256});
  for (const int max_tokens : {1, 3, 7, 33}) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 6; ++i) {
      EngineRequest r = Req("m" + std::to_string(max_tokens) + "-" + std::to_string(i), Tokens(5 + 17 * i, 40 + i),
                            max_tokens, i % 2 == 0 ? std::nullopt : std::optional<uint64_t>(i), i % 2 ? 0.8f : 0.0f);
      auto s = e->Submit(std::move(r));
      ASSERT_TRUE(s.ok()) << s.status();
      streams.push_back(*s);
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      RequestOutput o;
      size_t tokens = 0;
      while (streams[i]->Next(&o)) {
        tokens += o.token_ids.size();
        if (o.finished) {
          EXPECT_TRUE(o.status.ok()) << o.status;
          EXPECT_EQ(o.finish_reason, FinishReason::kLength) << max_tokens << " " << i;
          EXPECT_EQ(o.metrics.completion_tokens, max_tokens) << "max_tokens " << max_tokens << ", prompt " << i;
          EXPECT_GT(o.metrics.ttft_s, 0.0) << "max_tokens " << max_tokens << ", prompt " << i;
        }
      }
      EXPECT_EQ(tokens, static_cast<size_t>(max_tokens)) << "max_tokens " << max_tokens << ", prompt " << i;
    }
  }
  // Cancelled mid-stream: the count is what was streamed (not the step still computing).
  auto s = e->Submit(Req("cancelled", Tokens(20, 3), 2000, 1));
  ASSERT_TRUE(s.ok());
  RequestOutput o;
  size_t streamed = 0;
  int32_t counted = -1;
  absl::Status status;
  bool cancel_sent = false;
  while ((*s)->Next(&o)) {
    streamed += o.token_ids.size();
    // At 5 or more: a consumer that falls behind gets several tokens in one output.
    if (streamed >= 5 && !o.finished && !cancel_sent) {
      e->Cancel("cancelled");
      cancel_sent = true;
    }
    if (o.finished) {
      counted = o.metrics.completion_tokens;
      status = o.status;
    }
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_GE(streamed, 5u);
  EXPECT_EQ(counted, static_cast<int32_t>(streamed));
  ExpectNoBlocksInUse(*e);
}

TEST_P(EngineTest, FullWaitingQueueIsResourceExhausted) {
  auto e = MakeEngine({.max_running = 1, .max_waiting = 2});
  std::vector<std::shared_ptr<OutputStream>> streams;
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    auto s = e->Submit(Req("w" + std::to_string(i), Tokens(30, i), 30, 1));
    if (s.ok()) streams.push_back(*s);
    else if (s.status().code() == absl::StatusCode::kResourceExhausted) ++refused;
  }
  EXPECT_GT(refused, 0);
  for (auto& s : streams) EXPECT_TRUE(Drain(*s).final.status.ok());
}

// Pipelined steps (the next step launched before this one's outputs, sequences that end
// computed one step further) emit exactly what one step at a time does, for every kind of
// request mixed: greedy and seeded sampling, penalties, stop strings and stop tokens, EOS,
// min_tokens and logprobs (those steps run one at a time), one-token requests, prompts
// longer than a step's token budget, more requests than fit in the batch.
TEST(EnginePipelineTest, SameOutputsAsOneStepAtATime) {
  std::vector<EngineRequest> reqs;
  std::mt19937 rng(5);
  for (int i = 0; i < 40; ++i) {
    EngineRequest r = Req("p" + std::to_string(i), Tokens(1 + static_cast<int>(rng() % 200), 300 + i),
                          1 + static_cast<int>(rng() % 40), static_cast<uint64_t>(1000 + i),
                          i % 3 == 0 ? 0.0f : 0.9f);
    r.stop.ignore_eos = i % 4 != 0;
    if (i % 5 == 1) r.stop.stop = {"e", "th"};
    if (i % 7 == 2) r.stop.stop_token_ids = {static_cast<int32_t>(3 + rng() % 1000)};
    if (i % 6 == 3) r.sampling.repetition_penalty = 1.3f;
    if (i % 9 == 4) r.stop.min_tokens = std::min(5, r.stop.max_tokens);
    if (i == 17 || i == 29) {  // every step with such a row runs one at a time: short ones
      r.sampling.logprobs = 2;
      r.stop.max_tokens = 3;
      r.stop.min_tokens = std::min(r.stop.min_tokens, 3);
    }
    reqs.push_back(std::move(r));
  }
  auto run = [&](EngineOptions o) {
    std::unique_ptr<Engine> e = MakeEngine(o);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (const EngineRequest& r : reqs) {
      auto st = e->Submit(r);
      EXPECT_TRUE(st.ok()) << st.status();
      streams.push_back(st.ok() ? *st : nullptr);
    }
    std::vector<Result> out;
    for (auto& st : streams) out.push_back(st ? Drain(*st) : Result{});
    ExpectNoBlocksInUse(*e);
    const auto* backend = dynamic_cast<const testing::DeviceSamplingCpuBackend*>(&e->backend());
    const int64_t steps = e->Stats().steps, launches = backend != nullptr ? backend->launches() : 0;
    std::printf("%lld steps, %lld of them launched pipelined\n", static_cast<long long>(steps),
                static_cast<long long>(launches));
    return std::make_tuple(std::move(out), launches, steps);
  };
  const EngineOptions base{.max_batch_tokens = 128, .max_running = 8};
  g_backend = Backend::kPipelined;
  EngineOptions one_at_a_time = base;
  one_at_a_time.pipeline_steps = false;
  const auto [want, launches_off, steps_off] = run(one_at_a_time);
  const auto [got, launches_on, steps_on] = run(base);
  g_backend = Backend::kCpu;
  const auto [host, unused, unused_steps] = run(base);
  EXPECT_EQ(launches_off, 0);
  EXPECT_GT(launches_on, steps_on / 2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(got[i].final.status.ok()) << i << " " << got[i].final.status;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    EXPECT_EQ(got[i].text, want[i].text) << i;
    EXPECT_EQ(got[i].final.finish_reason, want[i].final.finish_reason) << i;
    EXPECT_EQ(got[i].final.matched_stop, want[i].final.matched_stop) << i;
    EXPECT_EQ(got[i].final.metrics.completion_tokens, static_cast<int32_t>(got[i].tokens.size())) << i;
    EXPECT_EQ(got[i].tokens, host[i].tokens) << i << " (the host sampler's tokens)";
  }
}

// A device error at a pipelined launch, or when its tokens are collected, ends the
// requests of that step with INTERNAL and nothing else: the others finish, every block
// comes back, and the engine serves the next request.
TEST(EnginePipelineTest, FailedLaunchOrCollectionEndsOnlyItsRequests) {
  for (const bool at_collect : {false, true}) {
    EngineOptions o{.num_threads = 2, .max_batch_tokens = 256, .max_running = 4};
    o.backend_factory = [at_collect](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 2});
      if (!m.ok()) return m.status();
      auto b = std::make_unique<testing::DeviceSamplingCpuBackend>(std::move(*m), /*defer=*/true);
      b->FailLaunch(6, at_collect);
      return b;
    };
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(ModelDir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 12; ++i) {
      auto st = (*e)->Submit(Req("f" + std::to_string(i), Tokens(20 + i, 700 + i), 20, static_cast<uint64_t>(i)));
      ASSERT_TRUE(st.ok()) << st.status();
      streams.push_back(*st);
    }
    int failed = 0, ok = 0;
    for (auto& st : streams) {
      const Result r = Drain(*st);
      ASSERT_TRUE(r.final.finished);
      if (r.final.status.ok()) {
        ++ok;
        EXPECT_EQ(r.tokens.size(), 20u);
      } else {
        ++failed;
        EXPECT_EQ(r.final.status.code(), absl::StatusCode::kInternal) << r.final.status;
        EXPECT_NE(r.final.status.message().find("injected"), std::string::npos) << r.final.status;
      }
    }
    EXPECT_GT(failed, 0) << "at_collect " << at_collect;
    EXPECT_GT(ok, 0) << "at_collect " << at_collect;
    ExpectNoBlocksInUse(**e);
    const Result after = RunToEnd(**e, Req("after", Tokens(30, 9), 10, 1));
    EXPECT_TRUE(after.final.status.ok()) << after.final.status;
    EXPECT_EQ(after.tokens.size(), 10u);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineTest, ::testing::Values(Backend::kCpu, Backend::kPipelined),
                         [](const ::testing::TestParamInfo<Backend>& i) {
                           return i.param == Backend::kCpu ? std::string("HostSampling") : std::string("Pipelined");
                         });

}  // namespace
}  // namespace tandem
