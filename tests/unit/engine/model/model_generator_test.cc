// The generated built-in models carry DeepSeek-V3's chat template in their
// tokenizer_config.json (as the real checkpoint does), so chat prompts to `tiny` go
// through the template like a real model's.
#include "engine/model/model_generator.h"

#include <gtest/gtest.h>

#include "engine/chat_template/builtin_templates.h"
#include "engine/chat_template/model_chat_templates.h"
#include "engine/tokenizer/tokenizer.h"
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
