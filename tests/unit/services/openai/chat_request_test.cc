// The chat fields of /v1/chat/completions as the model's template sees them: every
// conversation of tests/goldens/chat_templates that an OpenAI client can send (string
// contents, tool calls with string arguments, tool results, tools, chat_template_kwargs)
// goes in as an OpenAI request body, through ParseChat (this front end) and FormatChat
// (the request core's rendering), and must come out byte-identical to what transformers'
// apply_chat_template rendered from the same conversation on the GPU machine
// (transformers_renderings.json): the reference nobody here wrote. Then the fields'
// validation, each a 400 naming the field.
#include "services/openai/chat_request.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "services/api/proto_convert.h"
#include "tests/unit/engine/chat_template/golden_cases.h"

namespace tandem::openai {
namespace {

using tandem::testing::GoldensDir;
using tandem::testing::ReadJson;

// Whether an OpenAI client could send this conversation as it stands: contents are
// strings or null, roles OpenAI's, tool-call arguments are JSON text (an object there would reach the
// template re-encoded), and messages have only the fields OpenAI defines.
bool SendableByOpenAiClients(const Json& conversation) {
  if (!conversation.value("add_generation_prompt", true)) return false;  // the API always adds it
  for (const Json& m : conversation["messages"]) {
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && key != "tool_calls" && key != "tool_call_id" && key != "name") {
        return false;
      }
    }
    const std::string role = m.value("role", "");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") return false;
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) return false;
    if (m.contains("tool_calls")) {
      for (const Json& c : m["tool_calls"]) {
        if (!c["function"]["arguments"].is_string()) return false;
      }
    }
  }
  return !conversation["messages"].empty();
}

ModelChatTemplates TemplatesOf(const tandem::testing::GoldenTemplate& t) {
  Json config = {{"chat_template", t.source}};
  if (t.tokens.bos_token) config["bos_token"] = *t.tokens.bos_token;
  if (t.tokens.eos_token) config["eos_token"] = *t.tokens.eos_token;
  absl::StatusOr<ModelChatTemplates> templates = ModelChatTemplates::FromFiles(config.dump(), std::nullopt);
  EXPECT_TRUE(templates.ok()) << t.name << ": " << templates.status();
  return *std::move(templates);
}

TEST(ChatRequestTest, OpenAiBodiesRenderAsTransformersRendersTheConversation) {
  ASSERT_FALSE(tandem::testing::SourceDir().empty()) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
  const Json reference = ReadJson(GoldensDir() + "/transformers_renderings.json");
  ASSERT_TRUE(reference.is_object()) << "tests/goldens/chat_templates/transformers_renderings.json is missing";
  std::map<std::string, Json> conversations;
  const Json all = ReadJson(GoldensDir() + "/conversations.json");
  for (const Json& c : all["conversations"]) {
    conversations[c["name"].get<std::string>()] = c;
  }
  std::map<std::string, ModelChatTemplates> templates;
  for (const auto& t : tandem::testing::LoadGoldenTemplates()) templates.emplace(t.name, TemplatesOf(t));

  int rendered = 0, refused = 0, with_tools = 0;
  for (const Json& c : reference["cases"]) {
    const std::string tname = c["template"].get<std::string>(), cname = c["conversation"].get<std::string>();
    SCOPED_TRACE(tname + " x " + cname);
    ASSERT_TRUE(templates.count(tname) && conversations.count(cname));
    const Json& conversation = conversations[cname];
    if (!SendableByOpenAiClients(conversation)) continue;
    Json body = {{"messages", conversation["messages"]}};
    if (conversation.contains("tools")) body["tools"] = conversation["tools"];
    if (conversation.contains("kwargs")) body["chat_template_kwargs"] = conversation["kwargs"];
    v1::GenerateRequest r;
    ChatOptions options;
    std::optional<ApiError> error = ParseChat(body, &r, &options);
    ASSERT_FALSE(error.has_value()) << error->message;
    absl::StatusOr<ChatPrompt> prompt = FormatChat(r.chat(), &templates.at(tname));
    if (!c["ok"].get<bool>()) {
      EXPECT_FALSE(prompt.ok()) << "transformers refused it: " << c["text"].get<std::string>();
      ++refused;
      continue;
    }
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(prompt->text, c["text"].get<std::string>());
    EXPECT_FALSE(prompt->add_special_tokens);
    ++rendered;
    if (!r.chat().tools_json().empty()) ++with_tools;
  }
  // Exactly what the goldens hold (7 templates): a conversation the filter above drops
  // by mistake fails here.
  std::printf("%d renderings identical to transformers (%d with tools), %d refused as transformers refused\n",
              rendered, with_tools, refused);
  EXPECT_EQ(rendered, 125);
  EXPECT_EQ(with_tools, 55);
  EXPECT_EQ(refused, 8);
}

std::optional<ApiError> Parse(const std::string& body_text, v1::GenerateRequest* r = nullptr,
                              ChatOptions* options = nullptr) {
  v1::GenerateRequest scratch;
  ChatOptions scratch_options;
  return ParseChat(Json::parse(body_text), r ? r : &scratch, options ? options : &scratch_options);
}

constexpr const char* kTool = R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})";

TEST(ChatRequestTest, ToolsAndToolCallsReachTheRequest) {
  v1::GenerateRequest r;
  ChatOptions options;
  const std::string body = std::string(R"({"messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "one"},
      {"role": "developer", "content": "be brief", "name": "ops"}],
    "tools": [)") + kTool + R"(], "chat_template_kwargs": {"thinking": true, "x": [1]}})";
  ASSERT_FALSE(Parse(body, &r, &options).has_value());
  const v1::ChatMessages& chat = r.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_FALSE(chat.messages(1).has_content()) << "a turn of calls only shows the template None";
  ASSERT_EQ(chat.messages(1).tool_calls_size(), 2);
  EXPECT_EQ(chat.messages(1).tool_calls(0).arguments(), "{\"x\": 1}") << "JSON text passes as sent";
  EXPECT_EQ(chat.messages(1).tool_calls(1).arguments(), "{\"y\":2}");
  EXPECT_EQ(chat.messages(2).tool_call_id(), "c1");
  EXPECT_EQ(chat.messages(3).role(), "system");
  EXPECT_EQ(chat.messages(3).name(), "ops");
  EXPECT_EQ(Json::parse(chat.tools_json()), Json::parse(std::string("[") + kTool + "]"));
  EXPECT_EQ(chat.template_kwargs_json(), R"({"thinking":true,"x":[1]})");
  EXPECT_TRUE(options.thinking);
  EXPECT_TRUE(options.parse_tool_calls) << "tool_choice defaults to auto when tools are given";

  ChatOptions none;
  ASSERT_FALSE(Parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none", "tools": [)") +
                         kTool + "]}",
                     nullptr, &none)
                   .has_value());
  EXPECT_FALSE(none.parse_tool_calls);
  EXPECT_FALSE(none.required_calls.has_value());

  // "required" and a named function: parsed, and the calls the output is held to.
  ChatOptions required;
  ASSERT_FALSE(Parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", )"
                                 R"("tools": [)") + kTool + "]}",
                     nullptr, &required)
                   .has_value());
  EXPECT_TRUE(required.parse_tool_calls);
  ASSERT_TRUE(required.required_calls.has_value());
  ASSERT_EQ(required.required_calls->tools.size(), 1u);
  EXPECT_EQ(required.required_calls->tools[0].name, "f");
  EXPECT_FALSE(required.required_calls->single);
  ChatOptions named;
  ASSERT_FALSE(Parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], )"
                                 R"("tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": [)") +
                         kTool + "]}",
                     nullptr, &named)
                   .has_value());
  ASSERT_TRUE(named.required_calls.has_value());
  EXPECT_TRUE(named.required_calls->single);
}

TEST(ChatRequestTest, BadToolFieldsAre400sNamingTheField) {
  const std::string user = R"({"role": "user", "content": "x"})";
  struct Case {
    std::string body, param;
  };
  const std::vector<Case> cases = {
      {R"({"messages": [)" + user + R"(], "tools": {}})", "tools"},
      {R"({"messages": [)" + user + R"(], "tools": [{"type": "retrieval"}]})", "tools[0].type"},
      {R"({"messages": [)" + user + R"(], "tools": [{"type": "function", "function": {"name": ""}}]})",
       "tools[0].function.name"},
      {R"({"messages": [)" + user + R"(], "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [)" + user + R"(], "tool_choice": "auto"})", "tool_choice"},
      {R"({"messages": [)" + user + R"(], "tool_choice": 7, "tools": [)" + kTool + "]}", "tool_choice"},
      {R"({"messages": [)" + user + R"(], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [)" + user + R"(], "tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [)" +
           kTool + "]}",
       "tool_choice.function.name"},
      {R"({"messages": [)" + user + R"(], "tool_choice": {"function": {"name": "f"}}, "tools": [)" + kTool + "]}",
       "tool_choice.type"},
      {R"({"messages": [{"role": "tool", "content": "r"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "x", "function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].type"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "user", "content": "x", "name": 1}]})", "messages[0].name"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "function", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [)" + user + R"(], "chat_template_kwargs": []})", "chat_template_kwargs"},
      {R"({"messages": [)" + user + R"(], "chat_template_kwargs": {"thinking": "yes"}})",
       "chat_template_kwargs.thinking"},
      {R"({"messages": [)" + user + R"(], "chat_template_kwargs": {"tools": []}})", "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    std::optional<ApiError> e = Parse(c.body);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param.value_or(""), c.param) << e->message;
  }
}

TEST(ChatRequestTest, TheRequestCoreRefusesWhatTheTemplateCannotTakeNamingTheField) {
  const tandem::testing::GoldenTemplate v3 = [] {
    for (const auto& t : tandem::testing::LoadGoldenTemplates()) {
      if (t.name == "deepseek_v3") return t;
    }
    return tandem::testing::GoldenTemplate{};
  }();
  ASSERT_FALSE(v3.source.empty());
  const ModelChatTemplates templates = TemplatesOf(v3);
  v1::ChatMessages chat;
  chat.add_messages()->set_role("user");
  chat.mutable_messages(0)->set_content("x");
  for (const auto& [tools, message] : std::vector<std::pair<std::string, std::string>>{
           {"{", "chat.tools_json: not valid JSON"},
           {"{}", "chat.tools_json: must be a JSON array"},
           {"[1]", "chat.tools_json[0]: must be an object"},
           {std::string(100, '[') + std::string(100, ']'), "chat.tools_json: nested deeper than 64 levels"}}) {
    chat.set_tools_json(tools);
    absl::StatusOr<ChatPrompt> p = FormatChat(chat, &templates);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().message(), message);
    EXPECT_EQ(ParamOf(std::string(p.status().message())).value_or(""), "tools");
  }
  chat.clear_tools_json();
  chat.set_template_kwargs_json("[]");
  EXPECT_EQ(ParamOf(std::string(FormatChat(chat, &templates).status().message())).value_or(""), "chat_template_kwargs");
  chat.clear_template_kwargs_json();
  // A model without a template cannot show tools: refused, never dropped.
  chat.set_tools_json(std::string("[") + kTool + "]");
  absl::StatusOr<ChatPrompt> p = FormatChat(chat, nullptr);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("need the model's chat template"), std::string::npos) << p.status();
  chat.clear_tools_json();
  v1::ChatMessage* result = chat.add_messages();
  result->set_role("tool");
  result->set_content("r");
  EXPECT_EQ(FormatChat(chat, &templates).status().message(), "chat.messages[1].tool_call_id: required for a tool message");
}

}  // namespace
}  // namespace tandem::openai
