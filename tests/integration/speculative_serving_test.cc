// Speculative decoding through the served system (docs/speculative-decoding.md): workers
// started with --speculative-tokens 3 draft with the checkpoint's MTP layer; real
// tandem-router / tandem-prefill / tandem-decode processes on loopback, the KV (the MTP
// layer's included) from prefill to decode over UCX, and the prompt's last hidden state from
// the prefill replica through the router to the decode replica (PrefillResponse and
// DecodeRequest.mtp_hidden).
//
// Two checkpoints. `tiny` (random weights): its outputs depend on every bit of the KV, but
// its MTP layer's drafts are almost never accepted; with --speculative-min-confidence at
// the median confidence of its drafts, how many it drafts depends on each MTP pass (the
// hidden state handed over, the MTP layer's KV), so equal per-request draft counts say the
// decode replica drafted from the same state as an aggregated worker. `make-model
// --mtp-acceptance 0.7` (a test construction whose MTP layer is right for 70% of tokens):
// accepted drafts, their counts per request, the metrics, `tandem bench`, through
// `tandem serve-local --speculative-tokens`.
//
// What must hold: outputs, greedy and seeded, are the engine's, which are the same with and
// without speculation; every request drafts and accepts exactly as on an aggregated worker
// (--role both) with speculation; a replica of the other KV layout is refused; a decode
// replica refuses a missing or bad hidden state; the draft metrics pass promtool; a kill -9
// of a decode replica mid-stream loses nothing.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/cluster_probes.h"
#include "tests/integration/subprocess.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::BinaryPath;
using testing::ExpectAllKvFree;
using testing::Generate;
using testing::GenerationStub;
using testing::Metric;
using testing::ReferenceOutput;
using testing::RunProcess;
using testing::Stat;
using testing::StreamResult;
using testing::TextRequest;

constexpr int kDrafts = 3;
// About the median confidence of tiny's drafts (its MTP layer's most likely token's
// probability, a few times 1/vocab): some steps draft 3 tokens, some fewer, some none (41
// and 55 of 111 possible drafts on two 40-token requests).
constexpr const char* kTinyMinConfidence = "0.00035";
// The same for tiny-v4's MTP layer (FP8): 696 of 696 possible drafts at 0.0001, 531 at
// 0.0003, 58 at 0.0005 over the V4 test's eight 32-token requests.
constexpr const char* kTinyV4MinConfidence = "0.0004";

// Prompts of a few words to a few hundred tokens (blocks are 64 tokens: the longer ones
// span several, so their MTP entries cross blocks on the way to the decode replica).
std::string Prompt(int sentences, int salt) {
  static const char* kSentences[] = {
      "The draft model guesses the next tokens. ", "The target model checks every guess at once. ",
      "A refused guess ends the step with a corrected token. ", "Accepted guesses cost one step for several tokens. ",
      "The router forwards the hidden state to the decode replica. ", "Blocks of sixty-four tokens hold the cache. "};
  std::string s;
  for (int i = 0; i < sentences; ++i) s += kSentences[(i * 5 + salt) % 6];
  return s;
}

bool Seeded(const v1::GenerateRequest& r) { return r.sampling().has_seed(); }

// A checkpoint, its engines in this process (with and without drafts) and the speculation
// flags its replicas run with.
struct Checkpoint {
  std::string dir;
  // --speculative-tokens, --speculative-min-confidence, --no-speculative-adaptive (every step
  // drafts: the adaptive policy's choices follow the machine's timing, and so would the counts).
  std::vector<std::string> flags;
  std::unique_ptr<Engine> plain, drafting;

  absl::Status Open(const std::string& model_dir, const std::string& min_confidence) {
    dir = model_dir;
    flags = {"--speculative-tokens=" + std::to_string(kDrafts), "--speculative-min-confidence=" + min_confidence,
             "--no-speculative-adaptive"};
    EngineOptions o;
    o.num_threads = 1;
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(dir, o);
    if (!e.ok()) return e.status();
    plain = std::move(*e);
    o.speculative_tokens = kDrafts;
    o.speculative_min_confidence = std::stof(min_confidence);
    o.speculative_adaptive = false;
    e = Engine::Create(dir, o);
    if (!e.ok()) return e.status();
    drafting = std::move(*e);
    return absl::OkStatus();
  }
};

// What a request must give: the drafting engine's output (which is the plain engine's) and
// its draft counts, as an aggregated worker with the same flags counts them.
struct Expected {
  ReferenceOutput output;
  int32_t draft_tokens = 0;
  int32_t accepted_draft_tokens = 0;
};

class SpeculativeServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    tiny_ = new Checkpoint();
    mtp_ = new Checkpoint();
    ASSERT_TRUE(tiny_->Open(testing::TinyModelDir(), kTinyMinConfidence).ok());
    // The checkpoint as a user makes it: the CLI.
    const std::string dir = tmp_->Sub("tiny-mtp");
    auto mm = RunProcess({BinaryPath("tandem"), "make-model", "--preset", "tiny", "--mtp-acceptance", "0.7", "--out", dir});
    ASSERT_EQ(mm.exit_code, 0) << mm.err;
    const absl::Status st = mtp_->Open(dir, "0");
    ASSERT_TRUE(st.ok()) << st;
  }
  static void TearDownTestSuite() {
    delete tiny_;
    delete mtp_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_TRUE(tiny_->drafting != nullptr && mtp_->drafting != nullptr); }

  // A cluster of `model` whose workers, router and kvstores all run with its flags.
  static std::unique_ptr<LocalCluster> Start(const Checkpoint& model, int prefill, int decode, int both,
                                             std::vector<std::string> router_args = {}, int kvstores = 0,
                                             std::vector<std::string> worker_args = {}) {
    LocalClusterOptions o;
    o.model = model.dir;
    o.num_prefill = prefill;
    o.num_decode = decode;
    o.num_both = both;
    o.num_kvstore = kvstores;
    o.worker_args = {"--threads=1"};
    o.worker_args.insert(o.worker_args.end(), model.flags.begin(), model.flags.end());
    o.worker_args.insert(o.worker_args.end(), worker_args.begin(), worker_args.end());
    o.kvstore_args = {"--capacity=64M", model.flags[0]};
    // Fast beats so load reports are fresh; five may be missed on a loaded CI machine.
    o.router_args = {"--heartbeat-ms=200", "--missed-heartbeats=5", model.flags[0]};
    o.router_args.insert(o.router_args.end(), router_args.begin(), router_args.end());
    return testing::StartCluster(std::move(o));
  }

  // Prompts of 1 to ~300 tokens, each greedy and seeded (temperature 0.8); `salt` gives
  // other prompts and seeds.
  static std::vector<v1::GenerateRequest> Requests(int max_tokens, int salt = 0) {
    std::vector<v1::GenerateRequest> out;
    const int sentences[] = {1, 4, 12, 30};
    for (int i = 0; i < 4; ++i) {
      const std::string text = Prompt(sentences[i], i + 3 * salt);
      out.push_back(TextRequest(text, max_tokens, std::nullopt, 0.0f));
      out.push_back(TextRequest(text, max_tokens, std::optional<uint64_t>(500 + i + 10 * salt), 0.8f));
    }
    return out;
  }

  // Computed concurrently, as the served requests run.
  static std::vector<Expected> References(const Checkpoint& model, const std::vector<v1::GenerateRequest>& reqs) {
    std::vector<Expected> out(reqs.size());
    std::vector<std::thread> t;
    for (size_t i = 0; i < reqs.size(); ++i) {
      t.emplace_back([&, i] {
        out[i].output = testing::Reference(*model.drafting, reqs[i]);
        out[i].draft_tokens = out[i].output.metrics.draft_tokens;
        out[i].accepted_draft_tokens = out[i].output.metrics.accepted_draft_tokens;
        // Speculation changes no output, greedy or seeded.
        const ReferenceOutput plain = testing::Reference(*model.plain, reqs[i]);
        EXPECT_EQ(out[i].output.tokens, plain.tokens) << "request " << i << ": drafts changed the engine's output";
      });
    }
    for (auto& x : t) x.join();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE(out[i].output.status.ok()) << out[i].output.status;
      EXPECT_EQ(out[i].output.tokens.size(), static_cast<size_t>(reqs[i].stop().max_tokens()));
    }
    return out;
  }

  static std::string Label(const v1::GenerateRequest& r) {
    return std::to_string(r.text().size()) + "-byte prompt, " +
           (Seeded(r) ? "seed " + std::to_string(r.sampling().seed()) : std::string("greedy"));
  }

  static void ExpectExact(const StreamResult& got, const Expected& want, const std::string& what) {
    EXPECT_TRUE(got.status.ok()) << what << ": " << static_cast<int>(got.status.error_code()) << " "
                                 << got.status.error_message();
    EXPECT_EQ(got.tokens, want.output.tokens) << what << ": other tokens than the engine alone";
    EXPECT_EQ(got.text, want.output.text) << what << ": other text than the engine alone";
    EXPECT_EQ(got.final.usage().completion_tokens(), static_cast<int32_t>(want.output.tokens.size())) << what;
  }
  static void ExpectSameDrafts(const StreamResult& got, const Expected& want, const std::string& what) {
    EXPECT_EQ(got.final.usage().draft_tokens(), want.draft_tokens) << what;
    EXPECT_EQ(got.final.usage().accepted_draft_tokens(), want.accepted_draft_tokens) << what;
  }
  static void ExpectExactWithSameDrafts(const StreamResult& got, const Expected& want, const std::string& what) {
    ExpectExact(got, want, what);
    ExpectSameDrafts(got, want, what);
  }

  static testing::TempDir* tmp_;
  static Checkpoint* tiny_;
  static Checkpoint* mtp_;
};
testing::TempDir* SpeculativeServingTest::tmp_ = nullptr;
Checkpoint* SpeculativeServingTest::tiny_ = nullptr;
Checkpoint* SpeculativeServingTest::mtp_ = nullptr;

// `tandem generate --local --model DIR` over `r`, with `extra` flags: its stdout.
std::string GenerateLocal(const std::string& model_dir, const v1::GenerateRequest& r, std::vector<std::string> extra) {
  std::vector<std::string> cmd = {BinaryPath("tandem"), "generate", "--local", "--model", model_dir, "--threads", "1",
                                  "--ignore-eos", "--max-tokens", std::to_string(r.stop().max_tokens()),
                                  "--temperature", Seeded(r) ? "0.8" : "0"};
  if (Seeded(r)) extra.insert(extra.end(), {"--seed", std::to_string(r.sampling().seed())});
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  cmd.push_back(r.text());
  testing::ProcessResult p = RunProcess(cmd);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  return p.out;
}

// Checks `name`'s /metrics with promtool, and that its draft metrics agree with `drafted`
// and `accepted` (its totals) when given (-1: only that they are there).
void ExpectDraftMetrics(const LocalCluster& cluster, const std::string& name, int64_t drafted, int64_t accepted) {
  const std::string promtool = "/usr/bin/promtool";
  ASSERT_EQ(::access(promtool.c_str(), X_OK), 0) << "promtool not found; run scripts/install-deps.sh";
  const std::optional<ProcessInfo> p = testing::ProcessNamed(cluster, name);
  ASSERT_TRUE(p.has_value()) << name;
  const std::string text = testing::HttpGet(p->ready.value("admin", ""), "/metrics");
  for (const char* family :
       {"tandem_spec_draft_tokens_total", "tandem_spec_accepted_tokens_total", "tandem_spec_accepted_length"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + family + " "), std::string::npos) << name << " has no " << family;
  }
  testing::TempDir tmp;
  const std::string file = tmp.Sub(name + ".metrics.txt");
  std::ofstream(file) << text;
  testing::ProcessResult check = RunProcess({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file});
  EXPECT_EQ(check.exit_code, 0) << name << ": " << check.out << check.err;
  if (drafted < 0) return;
  EXPECT_EQ(Metric(cluster, name, "tandem_spec_draft_tokens_total"), drafted) << name;
  double by_position = 0;
  for (int p = 0; p < kDrafts; ++p) {
    const double n = Metric(cluster, name, "tandem_spec_accepted_tokens_total", "position=\"" + std::to_string(p) + "\"");
    EXPECT_GE(n, 0) << name << ", position " << p;
    by_position += n;
  }
  EXPECT_EQ(by_position, accepted) << name;
  // The histogram of accepted drafts per verify step: its sum is the accepted total.
  EXPECT_EQ(Metric(cluster, name, "tandem_spec_accepted_length_sum"), accepted) << name;
  EXPECT_EQ(Stat(cluster, name, "spec_draft_tokens"), drafted) << name;
  EXPECT_EQ(Stat(cluster, name, "spec_accepted_tokens"), accepted) << name;
}

// Sum of `f` over `results`.
template <typename F>
int64_t Total(const std::vector<StreamResult>& results, F f) {
  int64_t n = 0;
  for (const StreamResult& r : results) n += f(r.final.usage());
  return n;
}

TEST_F(SpeculativeServingTest, OnePrefillOneDecodeDraftsExactlyAsTheAggregatedWorker) {
  auto cluster = Start(*tiny_, 1, 1, /*both=*/1);
  ASSERT_NE(cluster, nullptr);
  std::vector<v1::GenerateRequest> reqs = Requests(40);
  // Greedy with logprobs: the verify rows' logprobs on the host, which must be the plain ones.
  reqs.push_back(reqs[4]);
  reqs.back().mutable_sampling()->set_logprobs(2);
  const std::vector<Expected> want = References(*tiny_, reqs);
  // Through the router: prefill-0 -> decode-0. The aggregated worker, both-0, is asked
  // directly (the router prefers disaggregated serving when it can).
  auto router = GenerationStub(cluster->router_address());
  const std::optional<ProcessInfo> both_process = testing::ProcessNamed(*cluster, "both-0");
  ASSERT_TRUE(both_process.has_value());
  auto both = v1::Generation::NewStub(testing::InternalChannel(*cluster, both_process->ready.value("grpc", "")));
  std::vector<StreamResult> served, aggregated;
  for (size_t i = 0; i < reqs.size(); ++i) {
    served.push_back(Generate(*router, reqs[i]));
    aggregated.push_back(Generate(*both, reqs[i]));
    ExpectExactWithSameDrafts(served[i], want[i], Label(reqs[i]) + ", disaggregated");
    ExpectExactWithSameDrafts(aggregated[i], want[i], Label(reqs[i]) + ", aggregated");
  }
  const int64_t drafted = Total(served, [](const v1::Usage& u) { return u.draft_tokens(); });
  const int64_t accepted = Total(served, [](const v1::Usage& u) { return u.accepted_draft_tokens(); });
  std::printf("speculative (tiny): %lld of %lld drafts accepted, %d tokens\n", static_cast<long long>(accepted),
              static_cast<long long>(drafted), 40 * static_cast<int>(reqs.size()));
  // Not every step drafts 3 (the confidence threshold cut some): the counts tell passes apart.
  EXPECT_GT(drafted, 0);
  EXPECT_LT(drafted, 3 * 39 * static_cast<int64_t>(reqs.size()));
  std::vector<float> served_logprobs;
  for (const v1::TokenLogprob& l : served.back().logprobs) served_logprobs.push_back(l.logprob());
  EXPECT_EQ(served_logprobs, want.back().output.logprobs);
  EXPECT_EQ(served_logprobs.size(), want.back().output.tokens.size());

  // What `tandem generate --local` prints: greedy without speculation, seeded with it (the
  // same seed); the flags are refused without --local.
  EXPECT_EQ(GenerateLocal(tiny_->dir, reqs[4], {}), served[4].text + "\n") << Label(reqs[4]);
  EXPECT_EQ(GenerateLocal(tiny_->dir, reqs[5], tiny_->flags), served[5].text + "\n") << Label(reqs[5]);
  testing::ProcessResult remote =
      RunProcess({BinaryPath("tandem"), "generate", "--addr", cluster->router_address(), tiny_->flags[0], "hi"});
  EXPECT_EQ(remote.exit_code, 2) << remote.err;

  // The decode replica counted every draft of the served requests, the aggregated worker
  // those it served; the prefill replica drafts none.
  ExpectDraftMetrics(*cluster, "decode-0", drafted, accepted);
  ExpectDraftMetrics(*cluster, "both-0", Total(aggregated, [](const v1::Usage& u) { return u.draft_tokens(); }),
                     Total(aggregated, [](const v1::Usage& u) { return u.accepted_draft_tokens(); }));
  EXPECT_EQ(Metric(*cluster, "prefill-0", "tandem_spec_draft_tokens_total"), 0);
  ExpectAllKvFree(*cluster);
}

TEST_F(SpeculativeServingTest, ServeLocalAcceptsDraftsAndBenchReportsThem) {
  // `tandem serve-local --speculative-tokens 3` as a user runs it (router, prefill, decode
  // and a kvstore, each told), on the --mtp-acceptance checkpoint: drafts are accepted, each
  // request's counts are the engine's, the decode replica's metrics add up, and `tandem
  // bench` reports the acceptance rate.
  const std::string ready = tmp_->Sub("serve-local.ready.json");
  testing::BackgroundProcess serve_local(
      {BinaryPath("tandem"), "serve-local", "--model", mtp_->dir, "--listen", "127.0.0.1:0", "--threads", "1",
       "--speculative-tokens", "3", "--no-speculative-adaptive", "--ready-file", ready, "--run-dir",
       tmp_->Sub("serve-local")},
      tmp_->Sub("serve-local.log"));
  for (int i = 0; i < 1200 && !std::filesystem::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << ReadFileToString(tmp_->Sub("serve-local.log")).value_or("");
  const nlohmann::json r = nlohmann::json::parse(ReadFileToString(ready).value());
  const std::string router = r["router"].value("grpc", "");
  std::string decode_admin;
  for (const nlohmann::json& p : r["processes"]) {
    if (p.value("role", "") == "decode") decode_admin = p.value("admin", "");
  }
  const std::vector<v1::GenerateRequest> reqs = Requests(40, /*salt=*/2);
  const std::vector<Expected> want = References(*mtp_, reqs);
  auto stub = GenerationStub(router);
  std::vector<StreamResult> got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    got.push_back(Generate(*stub, reqs[i]));
    ExpectExactWithSameDrafts(got[i], want[i], Label(reqs[i]));
  }
  const int64_t drafted = Total(got, [](const v1::Usage& u) { return u.draft_tokens(); });
  const int64_t accepted = Total(got, [](const v1::Usage& u) { return u.accepted_draft_tokens(); });
  std::printf("speculative (mtp 0.7): %lld of %lld drafts accepted\n", static_cast<long long>(accepted),
              static_cast<long long>(drafted));
  EXPECT_GT(accepted, drafted / 4) << "about 0.7 of first drafts should be accepted";
  // Every accepted draft, by position and per verify step, on the decode replica.
  const std::string metrics = testing::HttpGet(decode_admin, "/metrics");
  EXPECT_EQ(testing::MetricIn(metrics, "tandem_spec_draft_tokens_total"), drafted);
  EXPECT_EQ(testing::MetricIn(metrics, "tandem_spec_accepted_length_sum"), accepted);
  EXPECT_GT(testing::MetricIn(metrics, "tandem_spec_accepted_tokens_total", "position=\"2\""), 0)
      << "no chain of 3 drafts was accepted whole";

  const std::string json_file = tmp_->Sub("bench.json");
  auto bench = RunProcess({BinaryPath("tandem"), "bench", "--addr", router, "--num-prompts", "8", "--request-rate",
                           "inf", "--max-concurrency", "4", "--input-len", "32", "--output-len", "24", "--ignore-eos",
                           "--json", json_file, "--no-progress"},
                          {}, 300);
  ASSERT_EQ(bench.exit_code, 0) << bench.out << bench.err;
  EXPECT_NE(bench.out.find("Draft acceptance rate (%):"), std::string::npos) << bench.out;
  const nlohmann::json j = nlohmann::json::parse(ReadFileToString(json_file).value_or(""), nullptr, false);
  const nlohmann::json flat = j.flatten();
  double rate = -1, bench_drafted = -1, bench_accepted = -1;
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    const std::string key = it.key();
    if (key.ends_with("/draft_acceptance_rate")) rate = it->get<double>();
    if (key.ends_with("/draft_tokens")) bench_drafted = it->get<double>();
    if (key.ends_with("/accepted_draft_tokens")) bench_accepted = it->get<double>();
  }
  ASSERT_GT(bench_drafted, 0) << j.dump(2);
  EXPECT_GT(rate, 0.25) << j.dump(2);
  EXPECT_DOUBLE_EQ(rate, bench_accepted / bench_drafted);
  EXPECT_EQ(serve_local.Stop(), 0);
}

TEST_F(SpeculativeServingTest, TwoPrefillTwoDecodeConcurrentStreamsAndTheKvstore) {
  // Round-robin both ways (the default policies may leave a replica idle over so few
  // requests), and a kvstore holding the MTP layer's KV with the rest.
  auto cluster = Start(*tiny_, 2, 2, 0, {"--prefill-policy=round-robin", "--decode-policy=round-robin"},
                       /*kvstores=*/1);
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());

  // A prompt computed on one prefill replica is fetched from the kvstore by the other, its
  // MTP entries included: the decode replica drafts from them exactly as before.
  const std::vector<v1::GenerateRequest> fetched_reqs = {TextRequest(Prompt(30, 7), 24, std::nullopt, 0.0f),
                                                         TextRequest(Prompt(30, 7), 24, uint64_t{77}, 0.8f)};
  const std::vector<Expected> fetched_want = References(*tiny_, fetched_reqs);
  ExpectExactWithSameDrafts(Generate(*stub, fetched_reqs[0]), fetched_want[0], "computed");
  for (int k = 0; k < 500 && Stat(*cluster, "kvstore-0", "committed_blocks") <= 0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < fetched_reqs.size(); ++i) {  // the first on the other prefill replica
    const StreamResult r = Generate(*stub, fetched_reqs[i]);
    ExpectExactWithSameDrafts(r, fetched_want[i], Label(fetched_reqs[i]) + ", from the kvstore");
    EXPECT_GT(r.final.usage().cached_prompt_tokens(), 0) << Label(fetched_reqs[i]);
  }
  EXPECT_GT(Stat(*cluster, "kvstore-0", "hit_tokens"), 0);
  EXPECT_EQ(Stat(*cluster, "kvstore-0", "rejected_blocks"), 0);

  // Each request twice, all at once: transfers into both decode replicas overlap, and
  // verify steps are batched with other sequences'.
  const std::vector<v1::GenerateRequest> reqs = Requests(40, /*salt=*/1);
  const std::vector<Expected> want = References(*tiny_, reqs);
  const std::vector<StreamResult> got = testing::GenerateConcurrently(*stub, reqs, /*copies=*/2);
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t r = i % reqs.size();
    ExpectExactWithSameDrafts(got[i], want[r], Label(reqs[r]) + ", copy " + std::to_string(i / reqs.size()));
  }
  for (const char* name : {"decode-0", "decode-1"}) {
    EXPECT_GT(Metric(*cluster, name, "tandem_spec_draft_tokens_total"), 0) << name;
  }
  ExpectAllKvFree(*cluster);
}

TEST_F(SpeculativeServingTest, DeepSeekV4DraftsExactlyAsTheAggregatedWorkerAndFromTheKvstore) {
  // DeepSeek-V4's MTP layer (a sliding-window layer; rejected drafts roll back its ring and
  // the main layers' compressor state, docs/speculative-decoding.md "DeepSeek-V4"): the
  // prefill replica hands over the last hidden state's residual streams and the MTP ring
  // with the rest of the state, the kvstore keeps them with the prefix, and the decode
  // replica drafts as an aggregated worker does. make-model writes mtp.0.* in the official
  // naming (FP8, FP4 experts), as DeepSeek ships V4.
  const std::string dir = tmp_->Sub("tiny-v4-fp8");
  auto mm = RunProcess({BinaryPath("tandem"), "make-model", "--preset", "tiny-v4", "--dtype", "fp8", "--out", dir});
  ASSERT_EQ(mm.exit_code, 0) << mm.err;
  Checkpoint v4;
  const absl::Status opened = v4.Open(dir, kTinyV4MinConfidence);
  ASSERT_TRUE(opened.ok()) << opened;
  auto cluster = Start(v4, 2, 1, 1, {"--prefill-policy=round-robin"}, /*kvstores=*/1);
  ASSERT_NE(cluster, nullptr);
  auto router = GenerationStub(cluster->router_address());
  const std::optional<ProcessInfo> both_process = testing::ProcessNamed(*cluster, "both-0");
  ASSERT_TRUE(both_process.has_value());
  auto both = v1::Generation::NewStub(testing::InternalChannel(*cluster, both_process->ready.value("grpc", "")));

  const std::vector<v1::GenerateRequest> reqs = Requests(32, /*salt=*/3);
  const std::vector<Expected> want = References(v4, reqs);
  std::vector<StreamResult> served;
  for (size_t i = 0; i < reqs.size(); ++i) {
    served.push_back(Generate(*router, reqs[i]));
    ExpectExactWithSameDrafts(served.back(), want[i], Label(reqs[i]) + ", V4 disaggregated");
    ExpectExactWithSameDrafts(Generate(*both, reqs[i]), want[i], Label(reqs[i]) + ", V4 aggregated");
  }
  const int64_t drafted = Total(served, [](const v1::Usage& u) { return u.draft_tokens(); });
  const int64_t accepted = Total(served, [](const v1::Usage& u) { return u.accepted_draft_tokens(); });
  std::printf("speculative (tiny-v4): %lld of %lld drafts accepted\n", static_cast<long long>(accepted),
              static_cast<long long>(drafted));
  EXPECT_GT(drafted, 0);
  EXPECT_LT(drafted, 2 * 31 * static_cast<int64_t>(reqs.size())) << "the threshold cut few drafts";

  // A prompt of several blocks computed on one prefill replica, then asked of the other:
  // fetched from the kvstore (blocks, the state snapshot, the MTP ring), the same drafts.
  const std::vector<v1::GenerateRequest> again = {TextRequest(Prompt(30, 9), 24, std::nullopt, 0.0f),
                                                  TextRequest(Prompt(30, 9), 24, uint64_t{91}, 0.8f)};
  const std::vector<Expected> again_want = References(v4, again);
  served.push_back(Generate(*router, again[0]));
  ExpectExactWithSameDrafts(served.back(), again_want[0], "V4, computed");
  for (int k = 0; k < 500 && Stat(*cluster, "kvstore-0", "committed_blocks") <= 0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < again.size(); ++i) {
    served.push_back(Generate(*router, again[i]));
    ExpectExactWithSameDrafts(served.back(), again_want[i], Label(again[i]) + ", V4 from a cached prefix");
    EXPECT_GT(served.back().final.usage().cached_prompt_tokens(), 0) << Label(again[i]);
  }
  EXPECT_GT(Stat(*cluster, "kvstore-0", "hit_tokens"), 0);
  EXPECT_EQ(Stat(*cluster, "kvstore-0", "rejected_blocks"), 0);

  // `tandem generate --local` with the same flags and seed prints the served text.
  EXPECT_EQ(GenerateLocal(v4.dir, reqs[3], v4.flags), served[3].text + "\n") << Label(reqs[3]);
  // The decode replica counted every draft of every request served through the router.
  ExpectDraftMetrics(*cluster, "decode-0", Total(served, [](const v1::Usage& u) { return u.draft_tokens(); }),
                     Total(served, [](const v1::Usage& u) { return u.accepted_draft_tokens(); }));
  ExpectAllKvFree(*cluster);
}

TEST_F(SpeculativeServingTest, ReplicasOfTheOtherLayoutAndBadHiddenStatesAreRefused) {
  auto cluster = Start(*tiny_, 0, 1, 0);
  ASSERT_NE(cluster, nullptr);
  // A prefill replica without speculation keeps no MTP KV (another layout and fingerprint):
  // the router refuses it, and it says why and exits.
  const std::string ready = (std::filesystem::temp_directory_path() /
                             ("tandem-spec-refused-" + std::to_string(::getpid()) + ".json")).string();
  std::vector<std::string> argv = {BinaryPath("tandem-prefill"), "--role", "prefill", "--router",
                                   cluster->router_internal_address(), "--model", "tiny", "--threads=1",
                                   "--no-kvstore", "--ready-file", ready};
  for (const std::string& a : cluster->InternalAuthArgs()) argv.push_back(a);
  testing::ProcessResult refused = RunProcess(argv, {}, 60);
  EXPECT_NE(refused.exit_code, 0) << "a prefill replica without speculation joined a drafting cluster";
  EXPECT_NE(refused.err.find("layout_fingerprint"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--speculative-tokens"), std::string::npos) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(ready));
  // A request then fails at once and says why (no hang until its deadline).
  auto stub = GenerationStub(cluster->router_address());
  const auto t0 = std::chrono::steady_clock::now();
  const StreamResult r = Generate(*stub, TextRequest("hello", 8, std::nullopt, 0.0f), 30);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("prefill"), std::string::npos) << r.status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));

  // The decode replica takes a Decode call only with the prompt's last hidden state, of the
  // model's size and finite, and frees the reservation when it refuses one.
  const std::optional<ProcessInfo> decode = testing::ProcessNamed(*cluster, "decode-0");
  ASSERT_TRUE(decode.has_value());
  auto stats = nlohmann::json::parse(testing::HttpGet(decode->ready.value("admin", ""), "/stats"));
  const uint64_t fingerprint = std::stoull(stats.value("layout_fingerprint", "0"), nullptr, 16);
  auto channel = testing::InternalChannel(*cluster, decode->ready.value("grpc", ""));
  auto decode_stub = v1::Decode::NewStub(channel);
  const int64_t hidden = tiny_->drafting->config().hidden_size;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::string name;
    std::vector<float> mtp_hidden;
  };
  const std::vector<Case> cases = {{"none", {}},
                                   {"one too many", std::vector<float>(static_cast<size_t>(hidden) + 1, 0.5f)},
                                   {"a NaN", [&] {
                                      std::vector<float> h(static_cast<size_t>(hidden), 0.5f);
                                      h[3] = nan;
                                      return h;
                                    }()}};
  for (const Case& c : cases) {
    const std::string id = "bad-hidden-" + std::to_string(&c - cases.data());
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::ReserveRequest req;
      req.set_request_id(id);
      req.set_num_tokens(4);
      req.set_layout_fingerprint(fingerprint);
      v1::ReserveResponse resp;
      const grpc::Status st = decode_stub->Reserve(&ctx, req, &resp);
      ASSERT_TRUE(st.ok()) << c.name << ": " << st.error_message();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::DecodeRequest req;
    req.set_request_id(id);
    for (int32_t t : {1, 5, 6, 7}) req.add_prompt(t);
    req.set_first_token(8);
    req.mutable_stop()->set_max_tokens(4);
    for (float h : c.mtp_hidden) req.add_mtp_hidden(h);
    auto reader = decode_stub->Decode(&ctx, req);
    v1::GenerateResponse m;
    EXPECT_FALSE(reader->Read(&m)) << c.name;
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name << ": " << st.error_message();
    EXPECT_NE(st.error_message().find("mtp_hidden"), std::string::npos) << c.name << ": " << st.error_message();
  }
  ExpectAllKvFree(*cluster);
}

TEST_F(SpeculativeServingTest, KillingADecodeReplicaMidStreamMigratesEveryStream) {
  // kill -9 of a decode replica while it drafts for a dozen streams: each stream cut there
  // migrates (the router re-prefills prompt + the tokens sent; the new prefill hands the
  // other decode replica the hidden state of that longer prompt) and completes. A lease long
  // enough that none expires while its request waits for a prefill under this load.
  auto cluster = Start(*tiny_, 2, 2, 0, {}, 0, {"--kv-lease-ms=20000"});
  ASSERT_NE(cluster, nullptr);
  std::vector<v1::GenerateRequest> reqs;
  for (int salt = 0; salt < 2; ++salt) {
    for (v1::GenerateRequest& r : Requests(60, salt)) reqs.push_back(std::move(r));
  }
  const std::vector<Expected> want = References(*tiny_, reqs);
  auto stub = GenerationStub(cluster->router_address());
  std::vector<StreamResult> got(reqs.size());
  std::vector<std::thread> streams;
  for (size_t i = 0; i < reqs.size(); ++i) streams.emplace_back([&, i] { got[i] = Generate(*stub, reqs[i], 180); });
  // At a random moment once decode-0 has streams decoding; the seed is printed to replay it.
  const uint32_t seed = std::random_device{}();
  std::printf("speculative chaos: seed %u\n", seed);
  std::mt19937 rng(seed);
  // EXPECT, not ASSERT: returning now would leave the stream threads unjoined.
  EXPECT_TRUE(testing::KillWhenBusy(*cluster, "decode-0", 3, 100, rng));
  for (auto& t : streams) t.join();
  int exact = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpectExact(got[i], want[i], "stream " + std::to_string(i) + " (" + Label(reqs[i]) + ")");
    exact += got[i].status.ok() && got[i].tokens == want[i].output.tokens;
  }
  std::string router_log;
  const int migrated = testing::RouterMigrations(*cluster, &router_log);
  std::printf("speculative chaos: %d of %zu streams exact, %d migrations\n", exact, reqs.size(), migrated);
  EXPECT_GT(migrated, 0) << "no stream migrated; see " << router_log;
  ExpectAllKvFree(*cluster);
}

}  // namespace
}  // namespace tandem
