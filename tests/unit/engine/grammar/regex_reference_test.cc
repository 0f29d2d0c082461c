// The regex front end against Python's re.fullmatch (re.ASCII): the ctest fixture
// (tests/tools/regex_reference.py) labelled strings sampled from each pattern's parse
// tree as Python's parser gives it, mutations of them and random strings; the grammar
// fed byte by byte must accept exactly the strings Python matches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar/regex_to_grammar.h"
#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

TEST(RegexReferenceTest, AgreesWithPythonFullmatch) {
  const char* dir = std::getenv("TANDEM_BINARY_DIR");
  ASSERT_NE(dir, nullptr) << "run through ctest (TANDEM_BINARY_DIR)";
  std::ifstream f(std::string(dir) + "/tests/regex_reference/python.json");
  ASSERT_TRUE(f) << "the fixture engine_grammar_regex_python_reference did not run";
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json ref = nlohmann::json::parse(ss.str());
  int strings = 0, matching = 0;
  for (const auto& c : ref["cases"]) {
    const std::string pattern = c["pattern"].get<std::string>();
    SCOPED_TRACE("pattern " + pattern);
    absl::StatusOr<Grammar> g = RegexToGrammar(pattern);
    ASSERT_TRUE(g.ok()) << g.status();
    const RuleTable table = RuleTable::Build(*g);
    for (const auto& s : c["strings"]) {
      const std::string text = s[0].get<std::string>();
      const bool want = s[1].get<bool>();
      EXPECT_EQ(testing::Recognizes(table, text), want) << "string '" << text << "'";
      ++strings;
      matching += want;
    }
  }
  EXPECT_GE(ref["cases"].size(), 60u);
  EXPECT_GE(matching, 1000);
  std::printf("%d strings, %d matching, agreed with Python\n", strings, matching);
}

}  // namespace
}  // namespace tandem::grammar
