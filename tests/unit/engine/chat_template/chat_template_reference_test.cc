// Tandem's chat template interpreter against references nobody here wrote:
//  - Python's Jinja2 (Debian's python3-jinja2) in the environment transformers builds:
//    the ctest fixture (tests/tools/chat_template_reference.py) rendered every golden
//    template over every conversation, and every feature case; each rendering must be
//    byte-identical, and where Jinja2 raised, Tandem must return an error.
//  - transformers' apply_chat_template itself: tests/goldens/chat_templates/
//    transformers_renderings.json, made on the GPU machine by
//    scripts/device/chat_template_goldens.py (the comparison is skipped, loudly, until
//    that file is committed).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/chat_template/chat_template.h"
#include "tests/unit/engine/chat_template/golden_cases.h"

namespace tandem {
namespace {

using testing::OrderedJson;

std::string FirstDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return "first difference at byte " + std::to_string(i) + ": want " + testing::Quoted(want.substr(i, 80)) + ", got " +
         testing::Quoted(got.substr(i, 80));
}

struct Outcome {
  bool ok = false;
  std::string text;  // the rendering, or the error
};

Outcome RenderGolden(const testing::GoldenTemplate& t, const OrderedJson& conversation) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(t.source);
  if (!parsed.ok()) return {false, std::string(parsed.status().message())};
  absl::StatusOr<OrderedJson> context = MakeChatContext(testing::RequestOf(conversation), t.tokens);
  if (!context.ok()) return {false, std::string(context.status().message())};
  absl::StatusOr<std::string> out = parsed->Render(*context);
  if (!out.ok()) return {false, std::string(out.status().message())};
  return {true, *std::move(out)};
}

// Compares every (template, conversation) of a reference file's `cases`; returns how
// many agreed.
int CompareChatCases(const OrderedJson& cases, const char* reference) {
  const std::vector<testing::GoldenTemplate> templates = testing::LoadGoldenTemplates();
  const OrderedJson conversations = testing::ReadJson(testing::GoldensDir() + "/conversations.json")["conversations"];
  std::map<std::string, const testing::GoldenTemplate*> by_name;
  for (const auto& t : templates) by_name[t.name] = &t;
  std::map<std::string, OrderedJson> convs;
  for (const OrderedJson& c : conversations) convs[c["name"].get<std::string>()] = c;
  int agreed = 0;
  for (const OrderedJson& c : cases) {
    const std::string tname = c["template"].get<std::string>(), cname = c["conversation"].get<std::string>();
    SCOPED_TRACE(tname + " x " + cname);
    if (!by_name.count(tname) || !convs.count(cname)) {
      ADD_FAILURE() << "unknown template or conversation";
      continue;
    }
    const bool want_ok = c["ok"].get<bool>();
    // transformers' apply_chat_template refuses an empty conversation before it renders
    // (its own check, not the template's); Tandem's front ends make the same check
    // before rendering ("messages: ... non-empty"), and the renderer itself renders it as
    // Jinja2 does (the Jinja2 reference covers that case).
    if (!want_ok && convs[cname]["messages"].empty() &&
        c["error"].get<std::string>().find("empty conversation") != std::string::npos) {
      ++agreed;
      continue;
    }
    const Outcome got = RenderGolden(*by_name[tname], convs[cname]);
    if (want_ok) {
      const std::string want = c["text"].get<std::string>();
      EXPECT_TRUE(got.ok) << reference << " rendered it, Tandem failed: " << got.text;
      if (!got.ok) continue;
      EXPECT_EQ(got.text, want) << FirstDifference(want, got.text);
      if (got.text == want) ++agreed;
    } else {
      EXPECT_FALSE(got.ok) << reference << " raised " << c["error"].get<std::string>() << ", Tandem rendered "
                           << testing::Quoted(got.text);
      if (!got.ok) ++agreed;
    }
  }
  return agreed;
}

class Jinja2ReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::SourceDir().empty()) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
    reference_ = testing::ReadJson(testing::BinaryDir() + "/tests/chat_template_reference/jinja2.json");
    ASSERT_TRUE(reference_.is_object()) << "the fixture engine_chat_template_jinja2_reference did not run";
  }
  OrderedJson reference_;
};

TEST_F(Jinja2ReferenceTest, EveryTemplateOverEveryConversationIsByteIdentical) {
  const OrderedJson& cases = reference_["chat_cases"];
  const size_t templates = testing::LoadGoldenTemplates().size();
  ASSERT_GE(templates, 7u);
  ASSERT_EQ(cases.size(),
            templates * testing::ReadJson(testing::GoldensDir() + "/conversations.json")["conversations"].size())
      << "the fixture is stale: re-run ctest";
  int rendered = 0;
  for (const OrderedJson& c : cases) rendered += c["ok"].get<bool>() ? 1 : 0;
  const int agreed = CompareChatCases(cases, "Jinja2");
  EXPECT_EQ(agreed, static_cast<int>(cases.size()));
  std::printf("Jinja2 %s: %d of %zu renderings agree (%d byte-identical texts, %zu errors where Jinja2 raised)\n",
              reference_["jinja2_version"].get<std::string>().c_str(), agreed, cases.size(), rendered,
              cases.size() - rendered);
}

TEST_F(Jinja2ReferenceTest, EveryFeatureCaseMatches) {
  const OrderedJson cases = testing::ReadJson(testing::GoldensDir() + "/feature_cases.json")["cases"];
  const OrderedJson& results = reference_["feature_cases"];
  ASSERT_EQ(cases.size(), results.size()) << "the fixture is stale: re-run ctest";
  int agreed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i]["name"].get<std::string>();
    SCOPED_TRACE(name + ": " + cases[i]["template"].get<std::string>());
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(cases[i]["template"].get<std::string>());
    const bool want_ok = results[i]["ok"].get<bool>();
    if (name.rfind("syntax_", 0) == 0) {
      EXPECT_FALSE(want_ok) << "Jinja2 accepted a syntax_ case";
      EXPECT_FALSE(t.ok()) << "Jinja2 refused it when compiling: " << results[i]["error"].get<std::string>();
      if (!t.ok()) {
        EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(t.status().message().find("line "), std::string::npos) << t.status();
        ++agreed;
      }
      continue;
    }
    if (!t.ok()) {
      ADD_FAILURE() << "Jinja2 compiled it; Tandem: " << t.status();
      continue;
    }
    absl::StatusOr<std::string> out = t->Render(cases[i]["context"]);
    if (want_ok) {
      const std::string want = results[i]["text"].get<std::string>();
      EXPECT_TRUE(out.ok()) << "Jinja2 rendered " << testing::Quoted(want) << "; Tandem: " << out.status();
      if (!out.ok()) continue;
      EXPECT_EQ(*out, want) << FirstDifference(want, *out);
      if (*out == want) ++agreed;
    } else {
      EXPECT_FALSE(out.ok()) << "Jinja2 raised " << results[i]["error"].get<std::string>() << "; Tandem rendered "
                             << testing::Quoted(out.value_or(""));
      if (!out.ok()) {
        EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
        EXPECT_NE(out.status().message().find("line "), std::string::npos) << out.status();
        ++agreed;
      }
    }
  }
  EXPECT_EQ(agreed, static_cast<int>(cases.size()));
  std::printf("feature cases: %d of %zu agree with Jinja2\n", agreed, cases.size());
}

// raise_exception's message reaches the caller as written, as transformers' TemplateError.
TEST_F(Jinja2ReferenceTest, RaisedMessagesComeBackVerbatim) {
  const OrderedJson cases = testing::ReadJson(testing::GoldensDir() + "/feature_cases.json")["cases"];
  const OrderedJson& results = reference_["feature_cases"];
  int checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string error = results[i].value("error", "");
    if (error.rfind("TemplateError: ", 0) != 0) continue;
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(cases[i]["template"].get<std::string>());
    ASSERT_TRUE(t.ok());
    absl::StatusOr<std::string> out = t->Render(cases[i]["context"]);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.status().message().find(error), std::string::npos) << out.status() << " lacks " << error;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(TransformersReferenceTest, EveryTemplateOverEveryConversationIsByteIdentical) {
  ASSERT_FALSE(testing::SourceDir().empty()) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
  const std::string path = testing::GoldensDir() + "/transformers_renderings.json";
  const OrderedJson reference = testing::ReadJson(path);
  if (!reference.is_object()) {
    GTEST_SKIP() << "\n*** NOT CHECKED AGAINST TRANSFORMERS: " << path << " is absent. Make it on the GPU machine "
                 << "(python3 scripts/device/chat_template_goldens.py <repo>) and commit it. ***";
  }
  const OrderedJson& cases = reference["cases"];
  ASSERT_FALSE(cases.empty());
  const int agreed = CompareChatCases(cases, "transformers");
  EXPECT_EQ(agreed, static_cast<int>(cases.size()));
  std::printf("transformers %s: %d of %zu renderings agree\n",
              reference.value("transformers_version", std::string("?")).c_str(), agreed, cases.size());
}

}  // namespace
}  // namespace tandem
