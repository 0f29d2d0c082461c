// Helpers for DeepSeek-V4 tests: the tiny-v4 preset with a fixed vocabulary, written with
// a generated tokenizer into a temporary directory.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "engine/model/deepseek_v4/v4_generator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem::v4::testing {

using ::tandem::testing::TempDir;

inline nlohmann::json TinyV4Json(int64_t vocab_size = 512) {
  absl::StatusOr<std::string> text = V4PresetConfig("tiny-v4");
  EXPECT_TRUE(text.ok()) << text.status();
  nlohmann::json j = nlohmann::json::parse(text.value_or("{}"));
  j["vocab_size"] = vocab_size;
  return j;
}

// n token ids in [0, vocab), from a fixed seed.
inline std::vector<int32_t> RandomTokens(int64_t n, uint32_t seed, int64_t vocab = 512) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

inline std::string MakeV4Model(const TempDir& tmp, const std::string& name, const std::string& config_json,
                               DType dtype = DType::kF32, int shards = 1, uint64_t seed = 7) {
  ModelGeneratorOptions options;
  options.config_json = config_json;
  options.seed = seed;
  options.weight_dtype = dtype;
  options.num_shards = shards;
  const std::string out = tmp.Sub(name);
  absl::StatusOr<GeneratedModel> m = GenerateDeepseekV4Model(options, out);
  EXPECT_TRUE(m.ok()) << m.status();
  return out;
}

}  // namespace tandem::v4::testing
