// Helpers for tests that need a checkpoint: generate one from a preset or a config file
// into a fresh temporary directory (removed when the object goes away).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/model/model_generator.h"
#include "engine/model/mtp_test_model.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

inline std::string SourceDir() {
  const char* d = std::getenv("TANDEM_SOURCE_DIR");
  return d != nullptr ? d : ".";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a checkpoint with a generated tokenizer (no dependence on installed files).
inline std::string MakeModel(const TempDir& dir, const std::string& name, const std::string& config_json,
                             uint64_t seed = 7, DType dtype = DType::kBF16, int shards = 1) {
  ModelGeneratorOptions options;
  options.config_json = config_json;
  options.seed = seed;
  options.weight_dtype = dtype;
  options.num_shards = shards;
  const std::string out = dir.Sub(name);
  absl::StatusOr<GeneratedModel> m = GenerateModel(options, out);
  EXPECT_TRUE(m.ok()) << m.status();
  return out;
}

inline std::string PresetJson(const std::string& preset) {
  absl::StatusOr<std::string> p = PresetConfig(preset);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.value_or("");
}

// A make-model --mtp-acceptance checkpoint of the tiny preset's shapes (MTP drafts right for
// `acceptance` of tokens, engine/model/mtp_test_model.h); without weights when
// !write_weights (the CUDA backend generates them at load).
inline std::string MakeMtpTestModel(const TempDir& dir, const std::string& name, int64_t vocab, uint64_t seed,
                                    double acceptance, bool write_weights = true) {
  nlohmann::json config = nlohmann::json::parse(PresetJson("tiny"));
  config["vocab_size"] = vocab;
  ModelGeneratorOptions options;
  options.config_json = config.dump();
  options.seed = seed;
  options.mtp_acceptance = acceptance;
  options.write_weights = write_weights;
  const std::string out = dir.Sub(name);
  absl::StatusOr<GeneratedModel> m = GenerateModel(options, out);
  EXPECT_TRUE(m.ok()) << m.status();
  return out;
}

// The construction's tables of a checkpoint MakeMtpTestModel wrote.
inline MtpTestTokens MtpTestTokensOf(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/config.json");
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<MtpTestModelSpec> spec = ReadMtpTestModelSpec(text.value_or("{}"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return MtpTestTokens(spec.value_or(MtpTestModelSpec{}));
}

}  // namespace tandem::testing
