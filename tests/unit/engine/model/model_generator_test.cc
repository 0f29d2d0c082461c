// The generated built-in models carry DeepSeek-V3's chat template in their
// tokenizer_config.json (as the real checkpoint does), so chat prompts to `tiny` go
// through the template like a real model's.
#include "engine/model/model_generator.h"

#include <gtest/gtest.h>

#include "engine/chat_template/builtin_templates.h"
#include "engine/chat_template/model_chat_templates.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

TEST(ModelGeneratorTest, GeneratedTokenizerConfigCarriesTheDeepseekV3ChatTemplate) {
  testing::TempDir tmp;
  const std::string dir = testing::MakeModel(tmp, "tiny", testing::PresetJson("tiny"));
  absl::StatusOr<ModelChatTemplates> templates = ModelChatTemplates::Load(dir);
  ASSERT_TRUE(templates.ok()) << templates.status();
  ASSERT_EQ(templates->templates().size(), 1u);
  EXPECT_EQ(templates->templates()[0].second.source(), DeepseekV3ChatTemplate());
  EXPECT_EQ(templates->special_tokens().bos_token.value_or(""), "<｜begin▁of▁sentence｜>");
  ChatRequest r;
  r.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(templates->Apply(r).value_or("?"), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>");
  // The tokenizer still reads the file (the template is one more key to it).
  EXPECT_TRUE(Tokenizer::FromDir(dir).ok());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A config's vocab_size of the wrong type is an error naming it (it used to throw from
// nlohmann's get<int64_t>, out of the generator).
TEST(ModelGeneratorTest, AVocabSizeThatIsNotAnIntegerIsAnErrorNamingIt) {
  testing::TempDir dir;
  nlohmann::json config = nlohmann::json::parse(testing::PresetJson("tiny"));
  config["vocab_size"] = "many";
  ModelGeneratorOptions options;
  options.config_json = config.dump();
  absl::StatusOr<GeneratedModel> m = GenerateModel(options, dir.Sub("m"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "config.json: field 'vocab_size' must be an integer");
}

}  // namespace
}  // namespace tandem
