// The CPU forward pass against Hugging Face transformers: logits of a 112-token prompt,
// of 32 incremental decode steps, and a 64-token greedy continuation, for checkpoints of
// each DeepSeek variant. The goldens were made by scripts/goldens/make_goldens.py from
// the same generated checkpoint files (their checksums are checked first).
#include <cmath>
#include <fstream>
#include <numeric>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"
#include "xxhash.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::SourceDir;
using testing::TempDir;

struct Golden {
  nlohmann::json meta;
  std::vector<float> logits;  // [prompt + decode steps][vocab]
  int64_t vocab = 0;
  std::vector<int32_t> prompt, decode_inputs, greedy;
};

Golden LoadGolden(const std::string& name) {
  Golden g;
  const std::string base = SourceDir() + "/tests/goldens/" + name;
  absl::StatusOr<std::string> meta = ReadFileToString(base + ".json");
  EXPECT_TRUE(meta.ok()) << meta.status();
  g.meta = nlohmann::json::parse(meta.value_or("{}"));
  g.vocab = g.meta["vocab_size"].get<int64_t>();
  g.prompt = g.meta["prompt_ids"].get<std::vector<int32_t>>();
  g.decode_inputs = g.meta["decode_input_ids"].get<std::vector<int32_t>>();
  g.greedy = g.meta["greedy_ids"].get<std::vector<int32_t>>();
  absl::StatusOr<std::string> raw = ReadFileToString(base + ".logits.f32");
  EXPECT_TRUE(raw.ok()) << raw.status();
  g.logits.resize(raw->size() / 4);
  std::memcpy(g.logits.data(), raw->data(), g.logits.size() * 4);
  EXPECT_EQ(g.logits.size(), (g.prompt.size() + g.decode_inputs.size()) * g.vocab);
  return g;
}

// max |ours - theirs| over rows, relative to max |theirs|.
double RelativeMaxDiff(const float* ours, const float* theirs, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(ours[i]) - theirs[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(theirs[i])));
  }
  return max_diff / max_ref;
}

class HfGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = LoadGolden(GetParam());
    absl::StatusOr<std::string> config =
        ReadFileToString(SourceDir() + "/tests/goldens/configs/" + GetParam() + ".json");
    ASSERT_TRUE(config.ok()) << config.status();
    // Same seed and tokenizer choice as scripts/goldens/regenerate.sh.
    dir_ = MakeModel(tmp_, GetParam(), *config, /*seed=*/7);
    for (auto& [file, hash] : golden_.meta["checkpoint_xxh64"].items()) {
      absl::StatusOr<std::string> bytes = ReadFileToString(dir_ + "/" + file);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx",
                    static_cast<unsigned long long>(XXH64(bytes->data(), bytes->size(), 0)));
      ASSERT_EQ(hex, hash.get<std::string>())
          << "make-model no longer writes the checkpoint the goldens were made from; "
             "regenerate them (scripts/goldens/regenerate.sh)";
    }
    DeepseekModel::LoadOptions options;
    options.num_threads = 2;
    absl::StatusOr<std::unique_ptr<DeepseekModel>> model = DeepseekModel::Load(dir_, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }

  std::vector<int32_t> Blocks(int64_t tokens) {
    std::vector<int32_t> table((tokens + kKvBlockSize - 1) / kKvBlockSize);
    std::iota(table.begin(), table.end(), 0);
    return table;
  }

  TempDir tmp_;
  std::string dir_;
  Golden golden_;
  std::unique_ptr<DeepseekModel> model_;
};

TEST_P(HfGoldenTest, PromptAndIncrementalDecodeLogitsMatch) {
  const int64_t p = static_cast<int64_t>(golden_.prompt.size());
  const int64_t steps = static_cast<int64_t>(golden_.decode_inputs.size());
  ASSERT_GE(p, 100);
  ASSERT_EQ(steps, 32);
  LatentKvCache cache = model_->MakeKvCache(8);
  const std::vector<int32_t> table = Blocks(p + steps);

  ForwardSequence prompt{.tokens = golden_.prompt, .start_position = 0, .block_table = table, .all_logits = true};
  absl::StatusOr<std::vector<float>> logits = model_->Forward({&prompt, 1}, cache);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), static_cast<size_t>(p * golden_.vocab));
  const double prompt_diff = RelativeMaxDiff(logits->data(), golden_.logits.data(), logits->size());
  EXPECT_LE(prompt_diff, 1e-3) << "prompt logits";

  double worst_step = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const int32_t token = golden_.decode_inputs[i];
    ForwardSequence step{.tokens = {&token, 1}, .start_position = p + i, .block_table = table};
    absl::StatusOr<std::vector<float>> out = model_->Forward({&step, 1}, cache);
    ASSERT_TRUE(out.ok()) << out.status();
    const float* ref = &golden_.logits[(p + i) * golden_.vocab];
    const double diff = RelativeMaxDiff(out->data(), ref, golden_.vocab);
    EXPECT_LE(diff, 1e-3) << "decode step " << i;
    worst_step = std::max(worst_step, diff);
  }
  std::printf("%s: prompt max|diff|/max|logit| = %.2e, decode worst step = %.2e\n", GetParam().c_str(),
              prompt_diff, worst_step);
}

TEST_P(HfGoldenTest, ChunkedPrefillWithAbsorbedAttentionMatches) {
  // The prompt in three uneven chunks, attention in the absorbed form over the cached
  // prefix: the path a prefix-cache hit takes.
  const int64_t p = static_cast<int64_t>(golden_.prompt.size());
  LatentKvCache cache = model_->MakeKvCache(4);
  const std::vector<int32_t> table = Blocks(p);
  const int64_t cuts[] = {0, 37, 64, p};
  for (int c = 0; c < 3; ++c) {
    std::span<const int32_t> chunk(golden_.prompt.data() + cuts[c], cuts[c + 1] - cuts[c]);
    ForwardSequence seq{.tokens = chunk, .start_position = cuts[c], .block_table = table, .all_logits = true};
    absl::StatusOr<std::vector<float>> out = model_->Forward({&seq, 1}, cache, {.attention = AttentionForm::kAbsorbed});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_LE(RelativeMaxDiff(out->data(), &golden_.logits[cuts[c] * golden_.vocab], out->size()), 1e-3)
        << "chunk " << c;
  }
}

TEST_P(HfGoldenTest, GreedyContinuationIsIdentical) {
  const int64_t p = static_cast<int64_t>(golden_.prompt.size());
  const int64_t n = static_cast<int64_t>(golden_.greedy.size());
  ASSERT_EQ(n, 64);
  LatentKvCache cache = model_->MakeKvCache(8);
  const std::vector<int32_t> table = Blocks(p + n);
  std::vector<int32_t> generated;
  std::vector<int32_t> step = golden_.prompt;
  int64_t position = 0;
  while (static_cast<int64_t>(generated.size()) < n) {
    ForwardSequence seq{.tokens = step, .start_position = position, .block_table = table};
    absl::StatusOr<std::vector<float>> out = model_->Forward({&seq, 1}, cache);
    ASSERT_TRUE(out.ok()) << out.status();
    position += static_cast<int64_t>(step.size());
    const int32_t token = static_cast<int32_t>(std::max_element(out->begin(), out->end()) - out->begin());
    generated.push_back(token);
    step.assign(1, token);
  }
  EXPECT_EQ(generated, golden_.greedy);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfGoldenTest,
                         ::testing::Values("v3_yarn", "v3_rotate_half_tied", "v2_group_limited", "v2_lite_greedy"));

}  // namespace
}  // namespace tandem
