// Speculative decoding for DeepSeek-V4 through the engine on the CPU (docs/speculative-
// decoding.md): with the checkpoint's MTP layer drafting, greedy outputs and every logprob
// are bitwise those without drafts, batched, in chunks, after prefix hits (the state and
// the last hidden streams restored from a snapshot) and under preemption; seeded outputs
// too. Drafts scripted from the known continuation force every acceptance length, so the
// sliding-window ring and compressor windows are taken back over refused drafts at every
// offset, and the counts match the script.
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/architectures/architectures.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/speculative_test_support.h"

namespace tandem {
namespace {

using testing::RunAll;
using testing::Score;
using testing::Scored;

constexpr int64_t kVocab = 512;

const std::string& FpDir() {
  static testing::TempDir* tmp = new testing::TempDir();
  // FP8 with FP4 experts: the official names, which carry the MTP layer.
  static const std::string dir =
      v4::testing::MakeV4Model(*tmp, "tiny-v4-fp8", v4::testing::TinyV4Json(kVocab).dump(), DType::kF8E4M3);
  return dir;
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + salt * 7919 + (i * i) % 17) % 500;
  return t;
}

EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                      std::optional<uint64_t> seed = std::nullopt) {
  EngineRequest r = testing::GreedyRequest(id, std::move(prompt), max_tokens);
  r.sampling.logprobs = 3;
  if (seed) {
    r.sampling.seed = seed;
    r.sampling.temperature = 1.0f;
  }
  return r;
}

std::vector<EngineRequest> Mixed(int n, int max_tokens, bool seeded) {
  std::vector<EngineRequest> r;
  for (int i = 0; i < n; ++i) {
    r.push_back(Request(absl::StrCat("r", i), Prompt(5 + 23 * i % 90, i), max_tokens,
                        seeded ? std::optional<uint64_t>(500 + i) : std::nullopt));
  }
  return r;
}

std::unique_ptr<Engine> MakeEngine(int32_t drafts, EngineOptions o = {}) {
  o.num_threads = 2;
  o.speculative_tokens = drafts;
  o.speculative_adaptive = false;  // every step drafts
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(FpDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(EngineV4SpeculativeTest, GreedyAndSeededOutputsAreTheSameWithAndWithoutDrafts) {
  for (const bool seeded : {false, true}) {
    auto plain = MakeEngine(0);
    const std::vector<Scored> want = RunAll(*plain, Mixed(6, 24, seeded));
    auto spec = MakeEngine(3);
    const std::vector<Scored> got = RunAll(*spec, Mixed(6, 24, seeded));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << ", seeded " << seeded;
    const EngineStats st = spec->Stats();
    EXPECT_GT(st.spec_draft_tokens, 6 * 15) << "every step after the first drafts";
  }
}

TEST(EngineV4SpeculativeTest, ChunksPrefixHitsAndPreemptionChangeNothing) {
  // A small step budget (prompts in chunks next to verify steps), the same prompts again
  // (prefix hits: each continues from a state snapshot, its last hidden streams included)
  // and a pool too small for all at once (preemption and recomputation).
  auto plain = MakeEngine(0);
  const std::vector<Scored> want = RunAll(*plain, Mixed(6, 30, false));
  auto spec = MakeEngine(3, {.num_kv_blocks = 5, .max_batch_tokens = 40});
  for (int round = 0; round < 2; ++round) {
    const std::vector<Scored> got = RunAll(*spec, Mixed(6, 30, false));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << ", round " << round;
  }
  const EngineStats st = spec->Stats();
  EXPECT_GT(st.prompt_tokens_cached, 0);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.spec_draft_tokens, 0);
}

// A V4 CPU backend whose drafts come from a script: the known greedy continuation with
// the draft after a chosen number of right ones made wrong, so every acceptance length
// from 0 to all occurs. The MTP layer still runs (its ring and the pool's streams move as
// they would); only the drafts it returns are replaced.
class ScriptedDrafts : public ModelBackend {
 public:
  ScriptedDrafts(std::unique_ptr<ModelBackend> inner, std::vector<int32_t> sequence)
      : inner_(std::move(inner)), sequence_(std::move(sequence)) {}

  const ModelInfo& config() const override { return inner_->config(); }
  std::string device_name() const override { return "cpu (scripted drafts)"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    return inner_->Forward(batch, host, options);
  }
  bool has_mtp() const override { return inner_->has_mtp(); }
  absl::Status AcceptDrafts(int64_t slot, int32_t accepted) override {
    accepted_total_ += accepted;
    return inner_->AcceptDrafts(slot, accepted);
  }
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const override { return inner_->KeptHidden(row); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& host) override {
    absl::StatusOr<std::vector<std::vector<DraftToken>>> real = inner_->Draft(batch, host);
    if (!real.ok()) return real;
    for (size_t i = 0; i < batch.size(); ++i) {
      const DraftSequence& d = batch[i];
      // The drafts are for the positions after the last slot's token.
      const int64_t next = d.first_slot + static_cast<int64_t>(d.tokens.size());
      std::vector<DraftToken>& out = (*real)[i];
      out.clear();
      // 0 .. max_drafts right, in turn.
      const int32_t right = passes_++ % (d.max_drafts + 1);
      for (int32_t j = 0; j < d.max_drafts && next + j < static_cast<int64_t>(sequence_.size()); ++j) {
        const int32_t want = sequence_[static_cast<size_t>(next + j)];
        out.push_back({.token = j < right ? want : (want + 1) % static_cast<int32_t>(kVocab), .confidence = 1.0f});
      }
      int32_t stands = 0;
      while (stands < static_cast<int32_t>(out.size()) &&
             out[static_cast<size_t>(stands)].token == sequence_[static_cast<size_t>(next + stands)]) {
        ++stands;
      }
      scripted_.push_back(stands);
    }
    return real;
  }

  int64_t accepted_total_ = 0;
  std::vector<int32_t> scripted_;  // per draft pass, how many of its drafts are right

 private:
  std::unique_ptr<ModelBackend> inner_;
  std::vector<int32_t> sequence_;  // prompt + the greedy continuation
  int32_t passes_ = 0;
};

TEST(EngineV4SpeculativeTest, EveryAcceptanceLengthTakesTheStateBackExactly) {
  constexpr int kDrafts = 5, kOut = 60;
  for (const int prompt_len : {7, 30}) {
    const std::vector<int32_t> prompt = Prompt(prompt_len, prompt_len);
    auto plain = MakeEngine(0);
    const std::vector<Scored> want = RunAll(*plain, {Request("a", prompt, kOut)});
    std::vector<int32_t> sequence = prompt;
    sequence.insert(sequence.end(), want[0].tokens.begin(), want[0].tokens.end());

    ScriptedDrafts* scripted = nullptr;
    EngineOptions o;
    o.backend_factory = [&](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      absl::StatusOr<std::unique_ptr<ModelBackend>> inner = LoadModelBackend(dir, {.num_threads = 2, .mtp = true});
      if (!inner.ok()) return inner.status();
      auto b = std::make_unique<ScriptedDrafts>(std::move(*inner), sequence);
      scripted = b.get();
      return std::unique_ptr<ModelBackend>(std::move(b));
    };
    auto spec = MakeEngine(kDrafts, std::move(o));
    ASSERT_NE(scripted, nullptr);
    const std::vector<Scored> got = RunAll(*spec, {Request("a", prompt, kOut)});
    EXPECT_EQ(got[0], want[0]) << "prompt " << prompt_len;
    // The verify steps accepted what the script made right (every draft pass is verified
    // by the next step), and every length occurred.
    ASSERT_FALSE(scripted->scripted_.empty());
    int64_t right = 0;
    std::set<int32_t> lengths;
    for (int32_t r : scripted->scripted_) {
      right += r;
      lengths.insert(r);
    }
    EXPECT_EQ(scripted->accepted_total_, right);
    EXPECT_EQ(got[0].metrics.accepted_draft_tokens, right);
    for (int32_t a = 0; a <= kDrafts; ++a) EXPECT_TRUE(lengths.contains(a)) << "no pass with " << a << " right";
  }
}

}  // namespace
}  // namespace tandem
