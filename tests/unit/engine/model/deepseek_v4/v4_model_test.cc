// The V4 forward pass against itself: the incremental form (a decode step at a time, or
// a prefill in chunks that cut across window boundaries) gives the full form's logits
// bit for bit, whatever the thread count; the state holds what a paged cache will; and
// the mechanisms the tiny-v4 checkpoint is built to exercise do change the logits.
// tests/unit/engine/model/deepseek_v4/v4_golden_test.cc compares with transformers.
#include "engine/model/deepseek_v4/v4_model.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

constexpr int64_t kVocab = 512;

std::vector<int32_t> Prompt(int64_t n, uint32_t seed = 11) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  t[0] = 0;
  return t;
}

std::unique_ptr<DeepseekV4Model> Load(const std::string& dir, int threads = 2) {
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> m = DeepseekV4Model::Load(dir, {.num_threads = threads});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double MaxDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Runs `tokens` through a fresh state in chunks of the given sizes (the last repeated).
std::vector<float> Chunked(DeepseekV4Model& m, const std::vector<int32_t>& tokens, const std::vector<int64_t>& sizes,
                           SequenceState* out_state = nullptr) {
  SequenceState state = m.NewSequence();
  std::vector<float> logits;
  size_t pos = 0, i = 0;
  while (pos < tokens.size()) {
    const size_t n = std::min<size_t>(sizes[std::min(i++, sizes.size() - 1)], tokens.size() - pos);
    absl::StatusOr<std::vector<float>> l = m.Forward(std::span(tokens).subspan(pos, n), state);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return {};
    logits.insert(logits.end(), l->begin(), l->end());
    pos += n;
  }
  EXPECT_EQ(state.num_tokens, static_cast<int64_t>(tokens.size()));
  if (out_state != nullptr) *out_state = std::move(state);
  return logits;
}

class V4ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dir_ = new std::string(MakeV4Model(*tmp_, "tiny-v4", TinyV4Json(kVocab).dump(), DType::kF32));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete tmp_;
  }
  static TempDir* tmp_;
  static std::string* dir_;
};
TempDir* V4ModelTest::tmp_ = nullptr;
std::string* V4ModelTest::dir_ = nullptr;

TEST_F(V4ModelTest, FullPassGivesFiniteLogitsForEveryPosition) {
  std::unique_ptr<DeepseekV4Model> m = Load(*dir_);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = Prompt(300);
  absl::StatusOr<std::vector<float>> logits = m->ForwardFull(tokens);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), tokens.size() * kVocab);
  for (float x : *logits) ASSERT_TRUE(std::isfinite(x));
  const double max_abs = MaxAbs(*logits);
  EXPECT_GT(max_abs, 0.5);  // not collapsed to zero...
  EXPECT_LT(max_abs, 100);  // ...nor blown up by the residual streams
  // Positions differ (the context matters).
  EXPECT_GT(MaxDiff(&(*logits)[100 * kVocab], &(*logits)[200 * kVocab], kVocab), 1e-3);
}

TEST_F(V4ModelTest, DecodeStepsEqualTheFullPassBitwise) {
  std::unique_ptr<DeepseekV4Model> m = Load(*dir_);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = Prompt(150);
  absl::StatusOr<std::vector<float>> full = m->ForwardFull(tokens);
  ASSERT_TRUE(full.ok()) << full.status();
  const std::vector<float> steps = Chunked(*m, tokens, {1});
  ASSERT_EQ(steps.size(), full->size());
  EXPECT_EQ(MaxDiff(steps.data(), full->data(), steps.size()), 0.0);
}

TEST_F(V4ModelTest, ChunkedPrefillEqualsOnePassBitwise) {
  std::unique_ptr<DeepseekV4Model> m = Load(*dir_);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = Prompt(301);
  absl::StatusOr<std::vector<float>> full = m->ForwardFull(tokens);
  ASSERT_TRUE(full.ok()) << full.status();
  // Chunks ending inside CSA (4) and HCA (16) windows and inside the sliding window (16),
  // single tokens among them, and one chunk longer than the window.
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{
           {13, 24}, {1, 2, 3, 5, 7, 11, 17, 33}, {16, 16, 1, 15}, {299, 1, 1}, {301}}) {
    const std::vector<float> chunked = Chunked(*m, tokens, sizes);
    ASSERT_EQ(chunked.size(), full->size());
    EXPECT_EQ(MaxDiff(chunked.data(), full->data(), chunked.size()), 0.0) << "first chunk " << sizes[0];
  }
}

TEST_F(V4ModelTest, ThreadCountDoesNotChangeTheBits) {
  std::unique_ptr<DeepseekV4Model> one = Load(*dir_, 1);
  std::unique_ptr<DeepseekV4Model> three = Load(*dir_, 3);
  const std::vector<int32_t> tokens = Prompt(90);
  absl::StatusOr<std::vector<float>> a = one->ForwardFull(tokens);
  absl::StatusOr<std::vector<float>> b = three->ForwardFull(tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST_F(V4ModelTest, LastLogitsOnlyAndErrors) {
  std::unique_ptr<DeepseekV4Model> m = Load(*dir_);
  const std::vector<int32_t> tokens = Prompt(40);
  absl::StatusOr<std::vector<float>> full = m->ForwardFull(tokens);
  SequenceState state = m->NewSequence();
  absl::StatusOr<std::vector<float>> last = m->Forward(tokens, state, /*all_logits=*/false);
  ASSERT_TRUE(full.ok() && last.ok());
  ASSERT_EQ(last->size(), static_cast<size_t>(kVocab));
  EXPECT_EQ(MaxDiff(last->data(), &(*full)[39 * kVocab], kVocab), 0.0);
  const int32_t bad[] = {3, kVocab};
  EXPECT_EQ(m->Forward(bad, state).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.num_tokens, 40);  // unchanged by the failed call
  EXPECT_EQ(m->ForwardFull({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(V4ModelTest, StateHoldsTheStreamsOfTheLayout) {
  std::unique_ptr<DeepseekV4Model> m = Load(*dir_);
  const std::vector<int32_t> tokens = Prompt(150);
  SequenceState state;
  Chunked(*m, tokens, {37}, &state);
  const DeepseekV4Config& c = m->config();
  ASSERT_EQ(state.layers.size(), 4u);
  EXPECT_FALSE(state.layers[0].compressor.has_value());
  for (int l : {1, 3}) {  // CSA: 150 / 4 = 37 entries, 2 tokens waiting, indexer keys alike
    const LayerState& s = state.layers[l];
    ASSERT_TRUE(s.compressor && s.indexer);
    EXPECT_EQ(s.compressor->num_entries, 37);
    EXPECT_EQ(s.compressor->entries.size(), static_cast<size_t>(37 * c.head_dim));
    EXPECT_EQ(s.compressor->partial_tokens, 2);
    EXPECT_TRUE(s.compressor->has_overlap);
    EXPECT_EQ(s.indexer->num_entries, 37);
    EXPECT_EQ(s.indexer->entries.size(), static_cast<size_t>(37 * c.index_head_dim));
    EXPECT_GT(s.compressor->num_entries, c.index_topk);  // the indexer really selects
  }
  const LayerState& hca = state.layers[2];  // 150 / 16 = 9 entries, 6 waiting
  ASSERT_TRUE(hca.compressor && !hca.indexer);
  EXPECT_EQ(hca.compressor->num_entries, 9);
  EXPECT_EQ(hca.compressor->partial_tokens, 6);
  EXPECT_FALSE(hca.compressor->has_overlap);
  EXPECT_EQ(state.layers[0].window.size(), static_cast<size_t>(c.sliding_window * c.head_dim));
}

// A copy of tiny-v4 with one config field changed: the mechanism it controls changes
// the logits (the golden test's checkpoint depends on each of them).
double EffectOf(const TempDir& tmp, const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = TinyV4Json(kVocab);
  edit(j);
  std::unique_ptr<DeepseekV4Model> base = Load(MakeV4Model(tmp, name + "-base", TinyV4Json(kVocab).dump()));
  std::unique_ptr<DeepseekV4Model> changed = Load(MakeV4Model(tmp, name, j.dump()));
  if (base == nullptr || changed == nullptr) return -1;
  const std::vector<int32_t> tokens = Prompt(200);
  absl::StatusOr<std::vector<float>> a = base->ForwardFull(tokens);
  absl::StatusOr<std::vector<float>> b = changed->ForwardFull(tokens);
  if (!a.ok() || !b.ok()) return -1;
  return MaxDiff(a->data(), b->data(), a->size()) / MaxAbs(*a);
}

TEST_F(V4ModelTest, EveryMechanismMatters) {
  // Same weights (values are keyed by tensor name), one setting changed.
  EXPECT_GT(EffectOf(*tmp_, "topk", [](nlohmann::json& j) { j["index_topk"] = 64; }), 1e-3) << "indexer selection";
  EXPECT_GT(EffectOf(*tmp_, "window", [](nlohmann::json& j) { j["sliding_window"] = 32; }), 1e-3) << "sliding window";
  EXPECT_GT(EffectOf(*tmp_, "sinkhorn", [](nlohmann::json& j) { j["hc_sinkhorn_iters"] = 1; }), 1e-3) << "Sinkhorn";
  EXPECT_GT(EffectOf(*tmp_, "clamp", [](nlohmann::json& j) { j["swiglu_limit"] = 100.0; }), 1e-3) << "SwiGLU clamp";
  EXPECT_GT(EffectOf(*tmp_, "yarn", [](nlohmann::json& j) { j.erase("rope_parameters"); }), 1e-3) << "YaRN";
}

}  // namespace
}  // namespace tandem::v4
