// The prompt byte cap (--max-prompt-bytes) of every Generation implementation: a prompt
// over it, as text or chat messages, is INVALID_ARGUMENT naming "prompt" and the limit,
// and the tokenizer never sees it (a counting fake stands in for the real one); Tokenize
// applies the same cap; a tokenizer error (a pre-tokenization pattern over its
// backtracking budget) comes back as INVALID_ARGUMENT naming the field. Chat prompts in
// the model's chat format: its template when it has one (DeepSeek-V3's gives the same
// tokens as the built-in format it replaces), the DeepSeek-V3 format when it has none.
#include "services/api/proto_convert.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "engine/chat_template/builtin_templates.h"
#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "nlohmann/json.hpp"
#include "services/api/generation_helpers.h"

namespace tandem {
namespace {

// Encodes one id per byte; counts the bytes it was asked to encode. Fails on "FAIL".
class CountingTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> TryEncode(std::string_view text, bool) const override {
    encoded_bytes += static_cast<int64_t>(text.size());
    if (text.find("FAIL") != std::string_view::npos) {
      return absl::InvalidArgumentError("the tokenizer's pre-tokenization pattern gave up");
    }
    return std::vector<int32_t>(text.size(), 7);
  }
  std::string Decode(std::span<const int32_t>, bool) const override { return ""; }
  int32_t vocab_size() const override { return 100; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  bool IsSpecial(int32_t) const override { return false; }
  bool IsAdded(int32_t) const override { return false; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  std::string IdToToken(int32_t) const override { return ""; }
  std::string TokenBytes(int32_t) const override { return ""; }

  mutable std::atomic<int64_t> encoded_bytes{0};
};

v1::GenerateRequest Text(std::string text) {
  v1::GenerateRequest r;
  r.set_text(std::move(text));
  return r;
}

v1::GenerateRequest Chat(std::vector<std::pair<std::string, std::string>> messages) {
  v1::GenerateRequest r;
  for (auto& [role, content] : messages) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  return r;
}

TEST(PromptBytesTest, TextOverTheLimitIsRefusedBeforeTokenization) {
  CountingTokenizer tokenizer;
  absl::StatusOr<std::vector<int32_t>> at = PromptTokens(Text(std::string(1000, 'x')), tokenizer, 100, 1000, nullptr);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->size(), 1000u);
  EXPECT_EQ(tokenizer.encoded_bytes, 1000);

  absl::StatusOr<std::vector<int32_t>> over = PromptTokens(Text(std::string(1001, 'x')), tokenizer, 100, 1000, nullptr);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(), "prompt: 1001 bytes exceed the limit of 1000 bytes (--max-prompt-bytes)");
  EXPECT_EQ(tokenizer.encoded_bytes, 1000) << "the oversize prompt was tokenized";
}

TEST(PromptBytesTest, ChatMessagesCountTogether) {
  CountingTokenizer tokenizer;
  // 4 + 600 + 9 + 400 = 1013 bytes of roles and contents: over 1000 although every
  // message alone is under it.
  const v1::GenerateRequest chat = Chat({{"user", std::string(600, 'a')}, {"assistant", std::string(400, 'b')}});
  EXPECT_EQ(PromptBytes(chat), 1013);
  absl::StatusOr<std::vector<int32_t>> over = PromptTokens(chat, tokenizer, 100, 1000, nullptr);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("prompt: 1013 bytes exceed the limit of 1000"), std::string::npos)
      << over.status();
  EXPECT_EQ(tokenizer.encoded_bytes, 0);
  EXPECT_TRUE(PromptTokens(chat, tokenizer, 100, 1013, nullptr).ok());
  EXPECT_GT(tokenizer.encoded_bytes, 1013) << "the chat format's markers are tokenized too";
}

TEST(PromptBytesTest, TokenIdsAreNotBytesAndTheDefaultIsFourMiB) {
  CountingTokenizer tokenizer;
  v1::GenerateRequest ids;
  for (int i = 0; i < 50; ++i) ids.mutable_token_ids()->add_ids(3);
  EXPECT_EQ(PromptBytes(ids), 0);
  EXPECT_TRUE(PromptTokens(ids, tokenizer, 100, 1, nullptr).ok()) << "ids are bounded by the context, not tokenized";
  EXPECT_EQ(kDefaultMaxPromptBytes, 4 << 20);
  const std::string four_mib(kDefaultMaxPromptBytes, 'x');
  EXPECT_TRUE(PromptTokens(Text(four_mib), tokenizer, 100, kDefaultMaxPromptBytes, nullptr).ok());
}

TEST(PromptBytesTest, TokenizeAppliesTheSameLimit) {
  CountingTokenizer tokenizer;
  v1::TokenizeRequest text;
  text.set_text(std::string(2000, 'x'));
  v1::TokenizeResponse out;
  absl::Status st = TokenizeInto(text, tokenizer, nullptr, "m", 1999, &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prompt: 2000 bytes exceed the limit of 1999"), std::string::npos) << st;
  v1::TokenizeRequest chat;
  v1::ChatMessage* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(std::string(1996, 'y'));
  EXPECT_EQ(TokenizeInto(chat, tokenizer, nullptr, "m", 1999, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tokenizer.encoded_bytes, 0);
  EXPECT_TRUE(TokenizeInto(text, tokenizer, nullptr, "m", 2000, &out).ok());
  EXPECT_EQ(out.ids_size(), 2000);
}

TEST(PromptBytesTest, TokenizerErrorsNameTheField) {
  CountingTokenizer tokenizer;
  absl::StatusOr<std::vector<int32_t>> text = PromptTokens(Text("a FAIL b"), tokenizer, 100, 1000, nullptr);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "text: the tokenizer's pre-tokenization pattern gave up");
  absl::StatusOr<std::vector<int32_t>> chat = PromptTokens(Chat({{"user", "FAIL"}}), tokenizer, 100, 1000, nullptr);
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chat.status().message().rfind("chat: ", 0), 0u) << chat.status();
  v1::TokenizeRequest t;
  t.set_text("FAIL");
  v1::TokenizeResponse out;
  EXPECT_EQ(TokenizeInto(t, tokenizer, nullptr, "m", 1000, &out).message(),
            "text: the tokenizer's pre-tokenization pattern gave up");
}

// ---- chat prompts ----

ModelChatTemplates TemplatesOf(std::string_view source) {
  nlohmann::ordered_json config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<｜begin▁of▁sentence｜>"}}},
                                   {"eos_token", "<｜end▁of▁sentence｜>"},
                                   {"chat_template", std::string(source)}};
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::FromFiles(config.dump(), std::nullopt);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

const std::vector<std::pair<std::string, std::string>> kConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Name a color."}};

TEST(ChatFormatTest, TheModelsTemplateFormatsChats) {
  const ModelChatTemplates v3 = TemplatesOf(DeepseekV3ChatTemplate());
  absl::StatusOr<ChatPrompt> p = FormatChat(Chat(kConversation).chat(), &v3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->text,
            "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>Name a color.<｜Assistant｜>");
  EXPECT_FALSE(p->add_special_tokens) << "the template writes BOS itself, as transformers tokenizes";

  const ModelChatTemplates other = TemplatesOf("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}");
  p = FormatChat(Chat(kConversation).chat(), &other);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->text, "[system:Be brief.][user:Hi][assistant:Hello!][user:Name a color.]");
}

TEST(ChatFormatTest, WithoutATemplateTheDeepseekV3FormatIsKept) {
  absl::StatusOr<ChatPrompt> p = FormatChat(Chat(kConversation).chat(), nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->text,
            "Be brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>Name a color.<｜Assistant｜>");
  EXPECT_TRUE(p->add_special_tokens);
}

TEST(ChatFormatTest, DeepseekV3TemplateGivesTheTokensOfTheFormatItReplaced) {
  const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(2000);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const ModelChatTemplates v3 = TemplatesOf(DeepseekV3ChatTemplate());
  const v1::GenerateRequest chat = Chat(kConversation);
  absl::StatusOr<std::vector<int32_t>> with = PromptTokens(chat, **tokenizer, 2000, 1 << 20, &v3);
  absl::StatusOr<std::vector<int32_t>> without = PromptTokens(chat, **tokenizer, 2000, 1 << 20, nullptr);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(*with, *without);
  ASSERT_FALSE(with->empty());
  EXPECT_EQ(with->front(), (*tokenizer)->bos_id().value_or(-1)) << "one BOS, from the template";
  EXPECT_NE(with->size() > 1 ? (*with)[1] : -1, (*tokenizer)->bos_id().value_or(-1));
}

TEST(ChatFormatTest, TemplateErrorsAreInvalidArgument) {
  const ModelChatTemplates strict = TemplatesOf(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  absl::StatusOr<ChatPrompt> p = FormatChat(Chat(kConversation).chat(), &strict);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("chat: "), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("System role not supported"), std::string::npos) << p.status();
  const ModelChatTemplates v3 = TemplatesOf(DeepseekV3ChatTemplate());
  EXPECT_EQ(FormatChat(Chat({{"narrator", "x"}}).chat(), &v3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormatChat(v1::ChatMessages(), &v3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatFormatTest, TokenizeFormatsChatsAsGenerateDoes) {
  const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(2000);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
  ASSERT_TRUE(tokenizer.ok());
  const ModelChatTemplates v3 = TemplatesOf(DeepseekV3ChatTemplate());
  v1::TokenizeRequest t;
  *t.mutable_chat() = Chat(kConversation).chat();
  v1::TokenizeResponse out;
  ASSERT_TRUE(TokenizeInto(t, **tokenizer, &v3, "m", 1 << 20, &out).ok());
  absl::StatusOr<std::vector<int32_t>> generate = PromptTokens(Chat(kConversation), **tokenizer, 2000, 1 << 20, &v3);
  ASSERT_TRUE(generate.ok());
  EXPECT_EQ(std::vector<int32_t>(out.ids().begin(), out.ids().end()), *generate);
}

TEST(SamplingProtoTest, LogitBiasRoundTripsSortedAndIsValidated) {
  v1::SamplingParams p;
  (*p.mutable_logit_bias())[42] = -3.5f;
  (*p.mutable_logit_bias())[7] = 100.0f;
  (*p.mutable_logit_bias())[99] = 0.25f;
  absl::StatusOr<SamplingParams> s = FromProto(p, 100);
  ASSERT_TRUE(s.ok()) << s.status();
  // Sorted by id whatever order the map gives: the sampler adds them in this order.
  const std::vector<std::pair<int32_t, float>> want = {{7, 100.0f}, {42, -3.5f}, {99, 0.25f}};
  EXPECT_EQ(s->logit_bias, want);
  v1::SamplingParams back;
  ToProto(*s, &back);
  ASSERT_EQ(back.logit_bias_size(), 3);
  EXPECT_EQ(back.logit_bias().at(42), -3.5f);
  (*p.mutable_logit_bias())[100] = 1.0f;  // outside a vocabulary of 100
  absl::StatusOr<SamplingParams> bad = FromProto(p, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sampling.logit_bias: token id 100"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace tandem
