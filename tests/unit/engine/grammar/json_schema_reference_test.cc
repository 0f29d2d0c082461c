// The JSON schema front end against Ajv and the JSON Schema Test Suite (npm packages
// nobody here wrote; tests/tools/json_schema_reference.js):
//  - every random document generated from the grammars of the corpus
//    (tests/goldens/json_schemas/corpus.json) and of the suite's schemas
//    (write_json_documents: byte walks and token walks through the matcher's masks)
//    is valid JSON that Ajv2020 with ajv-formats accepts;
//  - the suite's valid data, written in the grammar's style, is accepted, and its
//    invalid data refused, except for the documented under-approximations listed below.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/grammar/json_schema_to_grammar.h"
#include "tests/unit/engine/grammar/recognize.h"

namespace tandem::grammar {
namespace {

using Json = nlohmann::ordered_json;

Json ReadOutput(const std::string& name) {
  const char* dir = std::getenv("TANDEM_BINARY_DIR");
  EXPECT_NE(dir, nullptr) << "run through ctest (TANDEM_BINARY_DIR)";
  std::ifstream f(std::string(dir ? dir : ".") + "/tests/json_schema_reference/" + name);
  EXPECT_TRUE(f) << name << " is missing: its ctest fixture did not run";
  std::stringstream ss;
  ss << f.rdbuf();
  return f ? Json::parse(ss.str()) : Json();
}

TEST(JsonSchemaReferenceTest, GeneratedDocumentsAreValidByAjv) {
  const Json docs = ReadOutput("documents.json");
  const Json validation = ReadOutput("validation.json");
  ASSERT_FALSE(docs.is_null());
  ASSERT_FALSE(validation.is_null());
  int corpus = 0, refused = 0;
  for (const Json& e : docs["entries"]) {
    const std::string name = e["name"].get<std::string>();
    const bool in_corpus = name.rfind("corpus: ", 0) == 0;
    if (e.contains("error")) {
      EXPECT_FALSE(in_corpus) << name << " does not compile: " << e["error"].get<std::string>();
      ++refused;
      continue;
    }
    corpus += in_corpus;
    EXPECT_GE(e["documents"].size(), 24u) << name << ": too few walks finished";
  }
  EXPECT_GE(corpus, 50);
  EXPECT_EQ(docs["unfinished"].get<int>(), 0);
  for (const Json& e : validation["entries"]) {
    for (const Json& bad : e["invalid"]) {
      ADD_FAILURE() << e["name"].get<std::string>() << ": Ajv refuses " << bad["document"].get<std::string>() << ": "
                    << bad["errors"].get<std::string>();
    }
  }
  EXPECT_EQ(validation["invalid"].get<int>(), 0);
  std::printf("%d documents of %zu schemas valid by Ajv; %d suite schemas refused\n",
              validation["documents"].get<int>(), validation["entries"].size(), refused);
}

// Suite tests the grammar decides differently from Ajv on purpose (see
// json_schema_to_grammar.h), by group and test description.
const std::map<std::string, std::string>& Documented() {
  const std::string untyped = "without 'type', only the types the schema's keywords constrain";
  static const auto* m = new std::map<std::string, std::string>{
      {"oneOf.json: oneOf|both oneOf valid", "oneOf over overlapping branches is anyOf"},
      {"items.json: a schema given for items|ignores non-arrays", untyped},
      {"maxItems.json: maxItems validation|ignores non-arrays", untyped},
      {"minItems.json: minItems validation|ignores non-arrays", untyped},
      {"maxLength.json: maxLength validation|ignores non-strings", untyped},
      {"minLength.json: minLength validation|ignores non-strings", untyped},
      {"pattern.json: pattern validation|ignores non-strings", untyped},
      {"maximum.json: maximum validation|ignores non-numbers", untyped},
      {"minimum.json: minimum validation|ignores non-numbers", untyped},
      {"properties.json: object properties validation|ignores non-objects", untyped},
      {"ref.json: root pointer ref|match", untyped},  // {"foo": false}: "#" has no type
      {"ref.json: root pointer ref|recursive match", untyped},
  };
  return *m;
}

TEST(JsonSchemaReferenceTest, SuiteDataIsDecidedAsAjvDecides) {
  const Json suite = ReadOutput("suite.json");
  ASSERT_FALSE(suite.is_null());
  int compiled = 0, refused = 0, agreed = 0, documented = 0;
  for (const Json& g : suite["groups"]) {
    const std::string group = g["name"].get<std::string>();
    SCOPED_TRACE(group);
    absl::StatusOr<Grammar> grammar = JsonSchemaToGrammar(g["schema"]);
    if (!grammar.ok()) {
      // Refused by name, never by crashing: the combination is outside the features.
      EXPECT_NE(std::string(grammar.status().message()).find("not supported"), std::string::npos) << grammar.status();
      ++refused;
      continue;
    }
    ++compiled;
    const RuleTable table = RuleTable::Build(*grammar);
    for (const Json& t : g["tests"]) {
      const std::string key = group + "|" + t["description"].get<std::string>();
      const bool want = t["valid"].get<bool>();
      const std::string data = t["data_python"].get<std::string>();
      const bool got = testing::Recognizes(table, data);
      if (got == want) {
        ++agreed;
      } else if (Documented().contains(key)) {
        ++documented;
      } else {
        ADD_FAILURE() << t["description"].get<std::string>() << ": " << data << " is "
                      << (want ? "valid" : "invalid") << " by the suite, the grammar " << (got ? "accepts" : "refuses");
      }
    }
  }
  EXPECT_GE(compiled, 25);
  std::printf("suite: %d schemas compiled, %d refused; %d tests agree, %d documented differences\n", compiled, refused,
              agreed, documented);
}

}  // namespace
}  // namespace tandem::grammar
