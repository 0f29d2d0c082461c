// The architectures' registry: a checkpoint's backend and its ModelInfo found by its
// model_type, and a clear error, naming what is supported, for what this build does not serve.
#include "engine/architectures/architectures.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

void WriteConfig(const std::string& dir, const std::string& text) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << text;
}

TEST(ArchitecturesTest, EveryDeepseekGenerationLoadsThroughTheRegistry) {
  testing::TempDir dir;
  for (const char* preset : {"tiny", "tiny-v2", "tiny-v4"}) {
    SCOPED_TRACE(preset);
    const std::string model = std::string(preset) == "tiny-v4"
                                  ? v4::testing::MakeV4Model(dir, preset, v4::testing::TinyV4Json().dump())
                                  : testing::MakeModel(dir, preset, testing::PresetJson(preset));
    absl::StatusOr<std::unique_ptr<ModelBackend>> b = LoadModelBackend(model, {.device = "cpu", .num_threads = 1});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->device_name(), "cpu");
    EXPECT_EQ((*b)->config().model_type, *ReadModelType(model));
    // What a router reads without the weights is what the loaded backend answers.
    absl::StatusOr<ModelInfo> info = LoadModelInfo(model);
    ASSERT_TRUE(info.ok()) << info.status();
    const ModelInfo& loaded = (*b)->config();
    EXPECT_EQ(info->model_type, loaded.model_type);
    EXPECT_EQ(info->vocab_size, loaded.vocab_size);
    EXPECT_EQ(info->max_position_embeddings, loaded.max_position_embeddings);
    EXPECT_EQ(info->bos_token_id, loaded.bos_token_id);
    EXPECT_EQ(info->eos_token_ids, loaded.eos_token_ids);
    EXPECT_EQ(info->summary, loaded.summary);
  }
}

TEST(ArchitecturesTest, WhatThisBuildDoesNotServeIsAClearError) {
  testing::TempDir dir;
  WriteConfig(dir.Sub("llama"), R"({"model_type": "llama"})");
  absl::StatusOr<std::unique_ptr<ModelBackend>> b = LoadModelBackend(dir.Sub("llama"), {});
  EXPECT_EQ(LoadModelInfo(dir.Sub("llama")).status().message(), b.status().message());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(),
            "config.json: field 'model_type' is 'llama'; supported: deepseek_v2, deepseek_v3, deepseek_v4");

  // A known architecture's own errors: a V4 config without weights, V4 on a GPU where
  // there is none (or in a build without CUDA).
  WriteConfig(dir.Sub("v4"), R"({"model_type": "deepseek_v4"})");
  b = LoadModelBackend(dir.Sub("v4"), {});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound) << b.status();
  EXPECT_NE(b.status().message().find("model.safetensors"), absl::string_view::npos) << b.status();
  const std::string v4 = v4::testing::MakeV4Model(dir, "tiny-v4", v4::testing::TinyV4Json().dump());
  if (CudaDeviceCount() == 0) {
    b = LoadModelBackend(v4, {.device = "cuda"});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    EXPECT_NE(b.status().message().find("--device cuda"), absl::string_view::npos) << b.status();
  }

  WriteConfig(dir.Sub("none"), R"({"vocab_size": 10})");
  EXPECT_EQ(ReadModelType(dir.Sub("none")).status().message(), "config.json: field 'model_type' is required");
  WriteConfig(dir.Sub("number"), R"({"model_type": 3})");
  EXPECT_EQ(ReadModelType(dir.Sub("number")).status().message(), "config.json: field 'model_type' must be a string");
  WriteConfig(dir.Sub("broken"), "{");
  EXPECT_EQ(ReadModelType(dir.Sub("broken")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ReadModelType(dir.Sub("absent")).ok());
}

}  // namespace
}  // namespace tandem
