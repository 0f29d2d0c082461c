// The V4 forward pass against Hugging Face transformers 5.17 (DeepseekV4ForCausalLM,
// float32, eager): for each checkpoint of tests/goldens/v4/manifest.json (tiny-v4 in f32
// with transformers' names, and in fp8 with the official names, FP8 linears and FP4
// experts) the logits of a 300-token prompt and of 32 incremental decode steps within
// 1e-3 x max |logit|, and a 64-token greedy continuation identical; for a checkpoint
// transformers wrote itself (bf16, sharded, tests/goldens/v4/hf_tiny_v4/) the same.
// The goldens come from scripts/device/v4_goldens.py (scripts/goldens/regenerate_v4.sh);
// each case skips, saying so, until its golden file is committed.
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "xxhash.h"

namespace tandem::v4 {
namespace {

using ::tandem::testing::SourceDir;
using testing::MakeV4Model;
using testing::TempDir;

struct Golden {
  nlohmann::json meta;
  int64_t vocab = 0;
  std::vector<int32_t> prompt, decode_inputs, greedy;
  std::vector<float> prompt_logits, decode_logits;  // [rows][vocab]
};

std::string GoldenDir() { return SourceDir() + "/tests/goldens/v4"; }

std::vector<float> Floats(const std::string& b64) {
  std::string bytes;
  EXPECT_TRUE(absl::Base64Unescape(b64, &bytes));
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// False (and the test skipped) when the golden file is not there yet.
bool LoadGolden(const std::string& name, Golden* g) {
  const std::string path = GoldenDir() + "/" + name + ".json";
  if (!std::filesystem::exists(path)) return false;
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  g->meta = nlohmann::json::parse(text.value_or("{}"));
  g->vocab = g->meta["vocab_size"].get<int64_t>();
  g->prompt = g->meta["prompt_ids"].get<std::vector<int32_t>>();
  g->decode_inputs = g->meta["decode_input_ids"].get<std::vector<int32_t>>();
  g->greedy = g->meta["greedy_ids"].get<std::vector<int32_t>>();
  g->prompt_logits = Floats(g->meta["prompt_logits_f32_b64"].get<std::string>());
  g->decode_logits = Floats(g->meta["decode_logits_f32_b64"].get<std::string>());
  EXPECT_EQ(g->prompt_logits.size(), g->prompt.size() * g->vocab);
  EXPECT_EQ(g->decode_logits.size(), g->decode_inputs.size() * g->vocab);
  return true;
}

// max |ours - theirs| relative to max |theirs|.
double RelativeMaxDiff(const float* ours, const float* theirs, size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(ours[i]) - theirs[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(theirs[i])));
  }
  return diff / ref;
}

int32_t Argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

void ExpectMatchesGolden(DeepseekV4Model& model, const Golden& g) {
  ASSERT_EQ(model.config().vocab_size, g.vocab);
  const size_t p = g.prompt.size(), v = static_cast<size_t>(g.vocab);

  // The prompt in one pass (nothing carried), then in two chunks through the state.
  absl::StatusOr<std::vector<float>> full = model.ForwardFull(g.prompt);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_LE(RelativeMaxDiff(full->data(), g.prompt_logits.data(), p * v), 1e-3) << "prompt logits";

  // Decode steps fed transformers' inputs, so that each step is compared on its own.
  SequenceState state = model.NewSequence();
  absl::StatusOr<std::vector<float>> prefill = model.Forward(std::span(g.prompt).first(p / 3), state);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  prefill = model.Forward(std::span(g.prompt).subspan(p / 3), state);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_LE(RelativeMaxDiff(prefill->data(), &g.prompt_logits[(p / 3) * v], (p - p / 3) * v), 1e-3)
      << "chunked prompt logits";
  double worst = 0;
  for (size_t i = 0; i < g.decode_inputs.size(); ++i) {
    const int32_t token = g.decode_inputs[i];
    absl::StatusOr<std::vector<float>> step = model.Forward(std::span(&token, 1), state);
    ASSERT_TRUE(step.ok()) << step.status();
    const double diff = RelativeMaxDiff(step->data(), &g.decode_logits[i * v], v);
    EXPECT_LE(diff, 1e-3) << "decode step " << i;
    worst = std::max(worst, diff);
  }
  std::printf("  prompt %zu tokens, %zu decode steps: worst decode diff %.2e of max |logit|\n", p,
              g.decode_inputs.size(), worst);

  // The greedy continuation, token for token.
  SequenceState greedy_state = model.NewSequence();
  absl::StatusOr<std::vector<float>> last = model.Forward(g.prompt, greedy_state, /*all_logits=*/false);
  ASSERT_TRUE(last.ok()) << last.status();
  std::vector<int32_t> ours = {Argmax(last->data(), g.vocab)};
  while (ours.size() < g.greedy.size()) {
    const int32_t token = ours.back();
    absl::StatusOr<std::vector<float>> step = model.Forward(std::span(&token, 1), greedy_state);
    ASSERT_TRUE(step.ok()) << step.status();
    ours.push_back(Argmax(step->data(), g.vocab));
  }
  EXPECT_EQ(ours, g.greedy) << "greedy continuation";
}

class V4GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(V4GoldenTest, MakeModelCheckpointMatchesTransformers) {
  Golden g;
  if (!LoadGolden(GetParam(), &g)) {
    GTEST_SKIP() << "no golden " << GoldenDir() << "/" << GetParam()
                 << ".json yet: scripts/goldens/regenerate_v4.sh make, then run it on the device";
  }
  absl::StatusOr<std::string> manifest_text = ReadFileToString(GoldenDir() + "/manifest.json");
  ASSERT_TRUE(manifest_text.ok()) << manifest_text.status();
  nlohmann::json entry;
  for (const nlohmann::json& e : nlohmann::json::parse(*manifest_text)) {
    if (e["name"] == GetParam()) entry = e;
  }
  ASSERT_FALSE(entry.is_null()) << GetParam() << " is not in the manifest";
  absl::StatusOr<std::string> config = ReadFileToString(GoldenDir() + "/" + entry["config"].get<std::string>());
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dtype = entry["dtype"];
  TempDir tmp;
  // As regenerate_v4.sh runs make-model: a generated tokenizer, the manifest's seed.
  const std::string dir = MakeV4Model(tmp, GetParam(), *config,
                                      dtype == "fp8" ? DType::kF8E4M3 : (dtype == "bf16" ? DType::kBF16 : DType::kF32),
                                      entry["shards"].get<int>(), entry["seed"].get<uint64_t>());
  for (auto& [file, hash] : g.meta["checkpoint_xxh64"].items()) {
    absl::StatusOr<std::string> bytes = ReadFileToString(dir + "/" + file);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64(bytes->data(), bytes->size(), 0)));
    ASSERT_EQ(hex, hash.get<std::string>()) << file << ": make-model no longer writes the checkpoint the golden was "
                                            << "made from; regenerate it (scripts/goldens/regenerate_v4.sh)";
  }
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> model = DeepseekV4Model::Load(dir, {.num_threads = 2});
  ASSERT_TRUE(model.ok()) << model.status();
  std::printf("  %s (transformers %s, loaded by %s)\n", GetParam().c_str(),
              g.meta["transformers"].get<std::string>().c_str(), g.meta["loader"].get<std::string>().c_str());
  ExpectMatchesGolden(**model, g);
}

INSTANTIATE_TEST_SUITE_P(Manifest, V4GoldenTest, ::testing::Values("tiny_v4_f32", "tiny_v4_fp8"));

TEST(V4GoldenTest, CheckpointWrittenByTransformersMatches) {
  Golden g;
  const std::string dir = GoldenDir() + "/hf_tiny_v4";
  if (!LoadGolden("hf_tiny_v4", &g) || !std::filesystem::exists(dir + "/config.json")) {
    GTEST_SKIP() << "no " << dir << " and its golden yet: scripts/device/v4_goldens.py writes both";
  }
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> model = DeepseekV4Model::Load(dir, {.num_threads = 2});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->weights().unused_tensors.empty());
  ExpectMatchesGolden(**model, g);
}

}  // namespace
}  // namespace tandem::v4
