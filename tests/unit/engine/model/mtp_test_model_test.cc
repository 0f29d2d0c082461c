// make-model --mtp-acceptance (engine/model/mtp_test_model.h): the main model's greedy
// continuation follows the successor exactly from any prompt, with a margin for every
// token of the vocabulary; the MTP module's first step drafts the successor for the good
// tokens only, and they are a P-dense subset; options the construction cannot serve are
// refused naming the flag.
#include "engine/model/mtp_test_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/deepseek_v4/v4_generator.h"
#include "engine/model/model_generator.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "kernels/cpu/norm_rope_act.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::PresetJson;
using testing::TempDir;

constexpr double kAcceptance = 0.75;
constexpr uint64_t kSeed = 11;
// The least margin (nats) the successor's logit must keep over the runner-up on every
// token: far more than the bf16 and thread-count roundings of any backend move a logit.
constexpr float kMinMargin = 3.0f;

// The tiny preset with another hidden size or vocabulary (DeepSeek-V3's 129280 is what
// `make-model --preset tiny` writes when its real tokenizer is installed).
struct Shape {
  int64_t hidden_size;
  int64_t vocab_size;
};

std::string TinyConfig(Shape shape) {
  nlohmann::json config = nlohmann::json::parse(PresetJson("tiny"));
  config["hidden_size"] = shape.hidden_size;
  config["vocab_size"] = shape.vocab_size;
  return config.dump();
}

absl::StatusOr<GeneratedModel> MakeMtpModel(const std::string& config_json, const std::string& dir,
                                            std::optional<double> acceptance = kAcceptance,
                                            DType dtype = DType::kBF16, bool write_weights = true) {
  ModelGeneratorOptions options;
  options.config_json = config_json;
  options.seed = kSeed;
  options.weight_dtype = dtype;
  options.write_weights = write_weights;
  options.mtp_acceptance = acceptance;
  return GenerateModel(options, dir);
}

struct TopTwo {
  int32_t best = -1;
  float margin = 0.0f;  // best logit minus the runner-up's
};
TopTwo Top(const float* logits, int64_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) best = logits[i] > logits[best] ? i : best;
  float second = -INFINITY;
  for (int32_t i = 0; i < n; ++i) second = i != best ? std::max(second, logits[i]) : second;
  return {best, logits[best] - second};
}

float Median(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// One generated checkpoint per shape, shared by the suite's tests.
class MtpTestModel : public ::testing::TestWithParam<Shape> {
 protected:
  static void SetUpTestSuite() { tmp_ = new TempDir(); }
  static void TearDownTestSuite() {
    models_.clear();
    delete tmp_;
  }
  void SetUp() override {
    const std::pair<int64_t, int64_t> key = {GetParam().hidden_size, GetParam().vocab_size};
    if (!models_.contains(key)) {
      const std::string dir = tmp_->Sub(absl::StrCat("h", key.first, "v", key.second));
      absl::StatusOr<GeneratedModel> generated = MakeMtpModel(TinyConfig(GetParam()), dir);
      ASSERT_TRUE(generated.ok()) << generated.status();
      absl::StatusOr<std::unique_ptr<DeepseekModel>> model = DeepseekModel::Load(dir, {.num_threads = 2});
      ASSERT_TRUE(model.ok()) << model.status();
      absl::StatusOr<std::string> config = ReadFileToString(dir + "/config.json");
      ASSERT_TRUE(config.ok()) << config.status();
      absl::StatusOr<MtpTestModelSpec> spec = ReadMtpTestModelSpec(*config);
      ASSERT_TRUE(spec.ok()) << spec.status();
      models_[key] = {std::move(*model), std::make_unique<MtpTestTokens>(*spec), *spec};
    }
    model_ = models_[key].model.get();
    tokens_ = models_[key].tokens.get();
    spec_ = &models_[key].spec;
    vocab_ = model_->config().vocab_size;
  }

  // Every token of a small vocabulary; of a large one (whose every row costs the whole
  // head), the special ids and a random sample.
  std::vector<int32_t> TokensToCheck() const {
    std::vector<int32_t> tokens;
    if (vocab_ <= 4096) {
      for (int32_t t = 0; t < vocab_; ++t) tokens.push_back(t);
      return tokens;
    }
    tokens = {0, 1, 2};
    std::mt19937 rng(17);
    while (tokens.size() < 256) tokens.push_back(static_cast<int32_t>(rng() % vocab_));
    return tokens;
  }

  // Logits of each sequence's last token, each sequence in blocks of its own.
  std::vector<float> LastLogits(const std::vector<std::vector<int32_t>>& sequences) {
    const int64_t blocks_each = 1 + static_cast<int64_t>(sequences[0].size()) / kKvBlockSize;
    LatentKvCache cache = model_->MakeKvCache(blocks_each * static_cast<int64_t>(sequences.size()));
    std::vector<std::vector<int32_t>> tables(sequences.size());
    std::vector<ForwardSequence> batch;
    for (size_t i = 0; i < sequences.size(); ++i) {
      for (int64_t b = 0; b < blocks_each; ++b) tables[i].push_back(static_cast<int32_t>(i * blocks_each + b));
      batch.push_back({.tokens = sequences[i], .start_position = 0, .block_table = tables[i]});
    }
    absl::StatusOr<std::vector<float>> logits = model_->Forward(batch, cache);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.value_or(std::vector<float>());
  }

  // Each token t after `prefix`: its greedy next token is f(t), by at least kMinMargin.
  void ExpectSuccessorForEveryToken(const std::vector<int32_t>& prefix) {
    const std::vector<int32_t> tokens = TokensToCheck();
    std::vector<std::vector<int32_t>> sequences;
    for (int32_t t : tokens) {
      sequences.push_back(prefix);
      sequences.back().push_back(t);
    }
    const std::vector<float> logits = LastLogits(sequences);
    ASSERT_EQ(logits.size(), tokens.size() * vocab_);
    std::vector<float> margins;
    double successor_mass = 0.0;  // the mean probability of f(t) at temperature 1
    int wrong = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int32_t t = tokens[i];
      const TopTwo top = Top(&logits[i * vocab_], vocab_);
      const float* row = &logits[i * vocab_];
      double partition = 0.0;
      for (int64_t r = 0; r < vocab_; ++r) partition += std::exp(static_cast<double>(row[r] - row[top.best]));
      successor_mass += 1.0 / partition / static_cast<double>(tokens.size());
      wrong += top.best != tokens_->Successor(t);
      EXPECT_EQ(top.best, tokens_->Successor(t)) << "token " << t << " at position " << prefix.size();
      margins.push_back(top.margin);
    }
    ASSERT_EQ(wrong, 0);
    const float least = *std::min_element(margins.begin(), margins.end());
    const float median = Median(margins);
    std::printf("hidden %lld, vocab %lld, position %zu: successor margin over %zu tokens least %.2f, median %.2f "
                "nats; mean probability %.4f\n",
                static_cast<long long>(GetParam().hidden_size), static_cast<long long>(vocab_), prefix.size(),
                tokens.size(), least, median, successor_mass);
    EXPECT_GE(least, kMinMargin);
    // The scale aims at kMtpTestTargetMargin over the expected runner-up.
    EXPECT_GE(median, 0.6 * kMtpTestTargetMargin);
    EXPECT_LE(median, 1.6 * kMtpTestTargetMargin);
  }

  struct Loaded {
    std::unique_ptr<DeepseekModel> model;
    std::unique_ptr<MtpTestTokens> tokens;
    MtpTestModelSpec spec;
  };
  static inline TempDir* tmp_ = nullptr;
  static inline std::map<std::pair<int64_t, int64_t>, Loaded> models_;
  DeepseekModel* model_ = nullptr;
  const MtpTestTokens* tokens_ = nullptr;
  const MtpTestModelSpec* spec_ = nullptr;
  int64_t vocab_ = 0;
};

TEST_P(MtpTestModel, GreedyContinuationFollowsTheSuccessorFromAnyPrompt) {
  // Prompts of random tokens, specials included: after the prompt's last token t the
  // model continues f(t), f(f(t)), ... for 40 steps, each decoded from the KV cache.
  std::mt19937 rng(5);
  constexpr int kSteps = 40;
  for (int prompt_length : {1, 2, 7, 23, 64, 90}) {
    std::vector<int32_t> sequence(static_cast<size_t>(prompt_length));
    for (int32_t& t : sequence) t = static_cast<int32_t>(rng() % vocab_);
    LatentKvCache cache = model_->MakeKvCache(3);
    const std::vector<int32_t> table = {0, 1, 2};
    ForwardSequence prefill{.tokens = sequence, .start_position = 0, .block_table = table};
    absl::StatusOr<std::vector<float>> logits = model_->Forward({&prefill, 1}, cache);
    ASSERT_TRUE(logits.ok()) << logits.status();
    for (int step = 0; step < kSteps; ++step) {
      const int32_t expected = tokens_->Successor(sequence.back());
      const TopTwo top = Top(logits->data(), vocab_);
      ASSERT_EQ(top.best, expected) << "prompt of " << prompt_length << ", step " << step;
      EXPECT_GE(top.margin, kMinMargin) << "prompt of " << prompt_length << ", step " << step;
      sequence.push_back(top.best);
      ForwardSequence decode{.tokens = {&sequence.back(), 1},
                             .start_position = static_cast<int64_t>(sequence.size()) - 1, .block_table = table};
      logits = model_->Forward({&decode, 1}, cache);
      ASSERT_TRUE(logits.ok()) << logits.status();
    }
  }
}

TEST_P(MtpTestModel, EveryTokensSuccessorWinsByAMarginAtTheFirstAndALaterPosition) {
  ExpectSuccessorForEveryToken({});
  std::mt19937 rng(9);
  std::vector<int32_t> prefix(12);
  for (int32_t& t : prefix) t = static_cast<int32_t>(rng() % vocab_);
  ExpectSuccessorForEveryToken(prefix);
}

TEST_P(MtpTestModel, MtpFirstStepDraftsTheSuccessorForGoodTokensOnly) {
  // The MTP's first step computed by hand from the loaded weights: x = eh_proj(
  // concat(enorm(embed(t)), hnorm(h))), logits = shared_head(shared_head_norm(x)), where h
  // stands for the main model's last hidden state before t (the vector of t's
  // predecessor, which the main layers barely move). The MTP decoder block is left out:
  // its o_proj and down_proj are scaled by kMtpTestLayerOutputScale (checked below), so
  // it moves x as little as the main layers move the main hidden state, which the tests
  // above show keeps every margin.
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  ASSERT_EQ(w.mtp_layers.size(), 1u);
  const MtpLayerWeights& mtp = w.mtp_layers[0];
  ASSERT_TRUE(mtp.embed.valid() && mtp.shared_head.valid()) << "the checkpoint carries the MTP's own embed and head";
  const int64_t hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  const MlpWeights& shared = *mtp.block.moe->shared;
  for (const WeightMatrix* m : {&mtp.block.attention.o_proj, &shared.down}) {
    std::vector<float> values(static_cast<size_t>(m->rows * m->cols));
    cpu::DequantizeRows(*m, 0, m->rows, values.data());
    float largest = 0.0f;
    for (float v : values) largest = std::max(largest, std::fabs(v));
    // The usual init is N(0, 1/fan_in), under 4.5 standard deviations (Irwin-Hall's range).
    EXPECT_LE(largest, 4.5f * kMtpTestLayerOutputScale / std::sqrt(static_cast<float>(m->cols)));
  }

  std::vector<float> eh(static_cast<size_t>(hidden * 2 * hidden)), head(static_cast<size_t>(vocab_ * hidden));
  cpu::DequantizeRows(mtp.eh_proj, 0, hidden, eh.data());
  cpu::DequantizeRows(mtp.shared_head, 0, vocab_, head.data());
  std::vector<float> in(static_cast<size_t>(2 * hidden)), x(static_cast<size_t>(hidden)), logits(vocab_);
  std::mt19937 rng(3);
  int64_t good_checked = 0;
  float least_margin = INFINITY;
  for (int32_t t : TokensToCheck()) {
    const int32_t before = tokens_->HeadVectorToken(t) >= 0 ? tokens_->HeadVectorToken(t)
                                                            : static_cast<int32_t>(rng() % vocab_);
    cpu::DequantizeRows(mtp.embed, t, 1, in.data());
    cpu::DequantizeRows(w.embed, before, 1, in.data() + hidden);
    cpu::RmsNorm(in.data(), 1, hidden, hidden, mtp.enorm, eps, in.data(), hidden);
    cpu::RmsNorm(in.data() + hidden, 1, hidden, hidden, mtp.hnorm, eps, in.data() + hidden, hidden);
    for (int64_t i = 0; i < hidden; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < 2 * hidden; ++j) sum += static_cast<double>(eh[i * 2 * hidden + j]) * in[j];
      x[i] = static_cast<float>(sum);
    }
    cpu::RmsNorm(x.data(), 1, hidden, hidden, mtp.shared_head_norm, eps, x.data(), hidden);
    for (int64_t r = 0; r < vocab_; ++r) {
      double sum = 0.0;
      for (int64_t i = 0; i < hidden; ++i) sum += static_cast<double>(head[r * hidden + i]) * x[i];
      logits[r] = static_cast<float>(sum);
    }
    const TopTwo top = Top(logits.data(), vocab_);
    least_margin = std::min(least_margin, top.margin);
    if (tokens_->MtpDraftsSuccessor(t)) {
      ++good_checked;
      EXPECT_EQ(top.best, tokens_->Successor(t)) << "good token " << t;
    } else {
      EXPECT_NE(top.best, tokens_->Successor(t)) << "bad token " << t;
      EXPECT_EQ(top.best, tokens_->Successor(tokens_->MtpVectorToken(t))) << "bad token " << t;
    }
  }
  // Drafts of both kinds are confident (--speculative-min-confidence does not stop them).
  EXPECT_GE(least_margin, kMinMargin);
  // The good tokens: a Bernoulli(P) draw per token, within 4 standard deviations.
  int64_t good = 0;
  for (int32_t t = 0; t < vocab_; ++t) good += tokens_->MtpDraftsSuccessor(t);
  const double fraction = static_cast<double>(good) / vocab_;
  std::printf("hidden %lld, vocab %lld: %lld tokens good (%.3f; %lld of those checked), least MTP margin %.2f nats\n",
              static_cast<long long>(GetParam().hidden_size), static_cast<long long>(vocab_),
              static_cast<long long>(good), fraction, static_cast<long long>(good_checked), least_margin);
  EXPECT_NEAR(fraction, kAcceptance, 4.0 * std::sqrt(kAcceptance * (1 - kAcceptance) / vocab_));
}

TEST_P(MtpTestModel, ConfigRecordsTheConstructionAndEveryTensorIsUsed) {
  EXPECT_EQ(spec_->acceptance, kAcceptance);
  EXPECT_EQ(spec_->seed, kSeed);
  // The generated tokenizer's specials are ids 0 (BOS), 1 (EOS) and 2 (pad).
  ASSERT_EQ(spec_->regular_token_ranges.size(), 1u);
  EXPECT_EQ(spec_->regular_token_ranges[0], std::make_pair(3, static_cast<int32_t>(vocab_)));
  EXPECT_TRUE(model_->weights().unused_tensors.empty()) << model_->weights().unused_tensors.front();
}

INSTANTIATE_TEST_SUITE_P(Shapes, MtpTestModel,
                         ::testing::Values(Shape{128, 1024}, Shape{64, 1024}, Shape{128, 129280}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("Hidden", info.param.hidden_size, "Vocab", info.param.vocab_size);
                         });

TEST(MtpTestTokensTest, TheSuccessorIsOneCycleOverTheRegularTokens) {
  // DeepSeek-V3's vocabulary: ids 0-2 and 128000-128814 are added tokens, the rest of the
  // 129280 rows are past the tokenizer.
  const MtpTestModelSpec spec{.acceptance = 0.5, .seed = 3, .vocab_size = 129280, .hidden_size = 7168,
                              .regular_token_ranges = {{3, 128000}}};
  const MtpTestTokens tokens(spec);
  ASSERT_EQ(tokens.num_regular(), 127997);
  int64_t good = 0;
  for (int32_t t = 0; t < spec.vocab_size; ++t) {
    const int32_t next = tokens.Successor(t);
    ASSERT_TRUE(tokens.IsRegular(next)) << t << " -> " << next;
    ASSERT_NE(next, t);
    // A token outside the regular set behaves as its alias.
    ASSERT_TRUE(tokens.IsRegular(tokens.VectorToken(t)));
    ASSERT_EQ(tokens.Successor(tokens.VectorToken(t)), next);
    ASSERT_EQ(tokens.HeadVectorToken(next) >= 0 ? tokens.Successor(tokens.HeadVectorToken(next)) : -1, next);
    ASSERT_EQ(tokens.MtpDraftsSuccessor(t), tokens.Successor(tokens.MtpVectorToken(t)) == next);
    good += tokens.MtpDraftsSuccessor(t);
  }
  int64_t period = 0;
  int32_t t = 3;
  do {
    t = tokens.Successor(t);
    ++period;
  } while (t != 3 && period <= tokens.num_regular());
  EXPECT_EQ(period, tokens.num_regular());
  EXPECT_NEAR(static_cast<double>(good) / spec.vocab_size, 0.5, 4.0 * std::sqrt(0.25 / spec.vocab_size));
  // The extremes are exact.
  for (double p : {0.0, 1.0}) {
    MtpTestModelSpec extreme = spec;
    extreme.acceptance = p;
    const MtpTestTokens all_or_none(extreme);
    for (int32_t token = 0; token < spec.vocab_size; token += 97) {
      ASSERT_EQ(all_or_none.MtpDraftsSuccessor(token), p == 1.0);
    }
  }
}

TEST(MtpTestModelOptionsTest, ConstructionsItCannotBuildAreRefusedNamingTheFlag) {
  TempDir tmp;
  auto expect_refused = [&](const absl::StatusOr<GeneratedModel>& m, const std::string& why) {
    ASSERT_FALSE(m.ok()) << why;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(m.status().message().find("--mtp-acceptance"), std::string::npos) << m.status();
    EXPECT_NE(m.status().message().find(why), std::string::npos) << m.status();
  };
  const std::string tiny = PresetJson("tiny");
  expect_refused(MakeMtpModel(PresetJson("tiny-v2"), tmp.Sub("v2")), "deepseek_v2");
  nlohmann::json no_mtp = nlohmann::json::parse(tiny);
  no_mtp["num_nextn_predict_layers"] = 0;
  expect_refused(MakeMtpModel(no_mtp.dump(), tmp.Sub("no-mtp")), "num_nextn_predict_layers");
  nlohmann::json tied = nlohmann::json::parse(tiny);
  tied["tie_word_embeddings"] = true;
  expect_refused(MakeMtpModel(tied.dump(), tmp.Sub("tied")), "tie_word_embeddings");
  expect_refused(MakeMtpModel(tiny, tmp.Sub("fp8"), kAcceptance, DType::kF8E4M3), "bf16 or f32");
  expect_refused(MakeMtpModel(tiny, tmp.Sub("gpu"), kAcceptance, DType::kF32, /*write_weights=*/false),
                 "--weights-on-gpu");
  for (double p : {-0.1, 1.5, std::nan("")}) expect_refused(MakeMtpModel(tiny, tmp.Sub("p"), p), "[0, 1]");
  nlohmann::json small = nlohmann::json::parse(tiny);
  small["hidden_size"] = 16;
  expect_refused(MakeMtpModel(small.dump(), tmp.Sub("small")), "too small");

  ModelGeneratorOptions v4;
  v4.config_json = v4::V4PresetConfig("tiny-v4").value_or("");
  v4.mtp_acceptance = kAcceptance;
  expect_refused(v4::GenerateDeepseekV4Model(v4, tmp.Sub("v4")), "deepseek_v4");
}

TEST(MtpTestModelOptionsTest, F32WritesTheSameConstructionAndP1AcceptsEveryDraft) {
  TempDir tmp;
  ASSERT_TRUE(MakeMtpModel(PresetJson("tiny"), tmp.Sub("f32"), 1.0, DType::kF32).ok());
  absl::StatusOr<std::string> config = ReadFileToString(tmp.Sub("f32") + "/config.json");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<MtpTestModelSpec> spec = ReadMtpTestModelSpec(*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const MtpTestTokens tokens(*spec);
  for (int32_t t = 0; t < tokens.vocab_size(); ++t) ASSERT_TRUE(tokens.MtpDraftsSuccessor(t));
  // A checkpoint without the option has no record.
  ASSERT_TRUE(MakeMtpModel(PresetJson("tiny"), tmp.Sub("plain"), std::nullopt).ok());
  config = ReadFileToString(tmp.Sub("plain") + "/config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(ReadMtpTestModelSpec(*config).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
