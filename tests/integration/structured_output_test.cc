// Structured output through the served, disaggregated system (router, one prefill and one
// decode replica on the tiny random-weight model), checked by references nobody here
// wrote: a python3-grpcio client sends every schema, regex and EBNF grammar of the
// corpora as GenerateRequest.constraint, greedy and sampled, and checks regexes with
// Python's re.fullmatch and EBNF outputs with a parser Lark generates from each grammar
// (tests/integration/structured_output_client.py, tests/tools/ebnf_to_lark.py);
// the JSON documents are validated by Ajv2020 + ajv-formats
// (tests/tools/json_schema_reference.js). Also: what the workers do with a constraint
// they cannot compile, and a constraint surviving the prefill-to-decode handover exactly.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string MakeTempDir() {
  std::string t = "/tmp/tandem-structured-XXXXXX";
  return ::mkdtemp(t.data()) ? t : "";
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = testing::StartCluster(1, 1, 0).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static LocalCluster* cluster_;
};
LocalCluster* StructuredOutputTest::cluster_ = nullptr;

TEST_F(StructuredOutputTest, EveryOutputIsValidByAnIndependentChecker) {
  ASSERT_NE(cluster_, nullptr);
  const std::string src = Env("TANDEM_SOURCE_DIR"), bin = Env("TANDEM_BINARY_DIR");
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::string modules = src + "/tools/node/node_modules";
  testing::ProcessResult suite = testing::RunProcess(
      {"/usr/bin/env", "node", src + "/tests/tools/json_schema_reference.js", "suite", "--node-modules", modules,
       "--out", dir + "/suite.json"});
  ASSERT_EQ(suite.exit_code, 0) << suite.err;

  testing::ProcessResult client = testing::RunProcess(
      {"/usr/bin/python3", src + "/tests/integration/structured_output_client.py", "--addr",
       cluster_->router_address(), "--stubs", bin + "/python", "--corpus",
       src + "/tests/goldens/json_schemas/corpus.json", "--suite", dir + "/suite.json", "--generated", "120",
       "--out", dir + "/documents.json"},
      {}, /*timeout_seconds=*/1200);
  std::cout << client.out;
  ASSERT_EQ(client.exit_code, 0) << client.out << client.err;
  const std::string last = client.out.substr(client.out.rfind('{', client.out.rfind("\"summary\"")));
  const nlohmann::json report = nlohmann::json::parse(last, nullptr, false);
  ASSERT_TRUE(report.is_object()) << client.out;
  const nlohmann::json& s = report["summary"];
  // The corpus: 69 written schemas, the suite's 37 groups within the supported keywords,
  // 120 generated ones (tests/tools/schema_corpus.py); each sent greedy and sampled.
  EXPECT_GE(report["schemas"].get<int>(), 200);
  EXPECT_EQ(s["json"]["requests"].get<int>(), 2 * report["schemas"].get<int>());
  // Refused, naming what is not supported: exactly three of the suite's groups (each
  // sent twice), combinations the front end does not build.
  const std::map<std::string, std::string> expected_refusals = {
      {"suite: anyOf.json: anyOf with base schema", "'anyOf' together with 'type' is not supported"},
      {"suite: oneOf.json: oneOf", "'oneOf' whose branches may overlap is not supported"},
      {"suite: oneOf.json: oneOf with base schema", "'oneOf' together with 'type' is not supported"},
  };
  EXPECT_EQ(s["json"]["refused"].get<int>(), 2 * static_cast<int>(expected_refusals.size())) << s;
  EXPECT_EQ(report["refusals"].size(), expected_refusals.size()) << report["refusals"];
  for (const auto& [name, why] : expected_refusals) {
    ASSERT_TRUE(report["refusals"].contains(name)) << name << ": " << report["refusals"];
    EXPECT_NE(report["refusals"][name].get<std::string>().find(why), std::string::npos) << report["refusals"][name];
  }
  EXPECT_EQ(s["regex"]["refused"].get<int>(), 0) << s;
  EXPECT_EQ(s["ebnf"]["refused"].get<int>(), 0) << s;
  EXPECT_EQ(s["regex"]["invalid"].get<int>(), 0) << s;
  EXPECT_EQ(s["ebnf"]["invalid"].get<int>(), 0) << s;
  // tests/tools/ebnf_corpus.py's grammars, each sent twice; the client has already checked
  // that each one's parser tells its known sentences from its known non-sentences.
  EXPECT_GE(report["ebnf_grammars"].get<int>(), 17);
  EXPECT_EQ(s["ebnf"]["requests"].get<int>(), 2 * report["ebnf_grammars"].get<int>()) << s;
  EXPECT_GT(s["ebnf"]["stop"].get<int>(), 0) << s;
  // Outputs cut short are checked too, as prefixes of a sentence.
  EXPECT_EQ(s["ebnf"]["length_prefix_checked"].get<int>(), s["ebnf"]["length"].get<int>()) << s;
  // A random model ends most documents well within max_tokens (the rest, in unbounded
  // repetitions, are LENGTH and incomplete by definition). Half is far below what it does.
  EXPECT_GT(s["json"]["stop"].get<int>(), s["json"]["requests"].get<int>() / 2) << s;
  EXPECT_GT(s["regex"]["stop"].get<int>(), s["regex"]["requests"].get<int>() / 2) << s;

  testing::ProcessResult validate = testing::RunProcess(
      {"/usr/bin/env", "node", src + "/tests/tools/json_schema_reference.js", "validate", "--node-modules", modules,
       "--in", dir + "/documents.json", "--out", dir + "/validation.json"});
  ASSERT_EQ(validate.exit_code, 0) << validate.err;
  const nlohmann::json v = ReadJson(dir + "/validation.json");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v["documents"].get<int>(), s["json"]["stop"].get<int>());
  EXPECT_EQ(v["invalid"].get<int>(), 0) << v.dump(1).substr(0, 4000);
  std::cout << validate.err;
}

v1::GenerateRequest Constrained(v1::Constraint c, std::optional<uint64_t> seed, int max_tokens = 64) {
  v1::GenerateRequest r = testing::TextRequest("Fill in:", max_tokens, seed, seed ? 1.0f : 0.0f);
  *r.mutable_constraint() = std::move(c);
  return r;
}

TEST_F(StructuredOutputTest, RefusalsAreInvalidArgumentNamingTheProblem) {
  auto stub = testing::GenerationStub(cluster_->router_address());
  struct Case {
    v1::Constraint c;
    std::string expect;
  };
  std::vector<Case> cases;
  cases.push_back({}); cases.back().c.set_json_schema(R"({"type": "object", "patternProperties": {"a": {}}})");
  cases.back().expect = "patternProperties";
  cases.push_back({}); cases.back().c.set_json_schema("{\"type\": ");
  cases.back().expect = "constraint.json_schema";
  cases.push_back({}); cases.back().c.set_regex("a(b");
  cases.back().expect = "constraint.regex";
  cases.push_back({}); cases.back().c.mutable_ebnf()->set_grammar("root ::= undefined_rule");
  cases.back().expect = "undefined_rule";
  cases.push_back({}); cases.back().c.set_regex("");
  cases.back().expect = "constraint.regex";
  cases.push_back({}); cases.back().c.set_regex("a"); cases.back().c.set_compact_json(true);
  cases.back().expect = "constraint.compact_json";
  for (const Case& c : cases) {
    const testing::StreamResult r = testing::Generate(*stub, Constrained(c.c, std::nullopt));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.expect << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.expect), std::string::npos) << r.status.error_message();
    EXPECT_TRUE(r.tokens.empty());
  }
  // Nothing leaked: the cluster still serves, constrained or not.
  v1::Constraint ok;
  ok.set_regex("[0-9]{3}");
  const testing::StreamResult r = testing::Generate(*stub, Constrained(ok, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.text.size(), 3u) << r.text;
}

TEST_F(StructuredOutputTest, DisaggregatedEqualsOneEngine) {
  // The decode replica rebuilds the matcher from the prefill's first token: the tokens are
  // those of one engine doing everything, greedy and seeded.
  auto stub = testing::GenerationStub(cluster_->router_address());
  EngineOptions o;
  o.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(testing::TinyModelDir(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  v1::Constraint c;
  c.set_json_schema(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                        "w": {"enum": ["up", "down"]}}, "required": ["n", "w"], "additionalProperties": false})");
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(77)}) {
    const v1::GenerateRequest req = Constrained(c, seed);
    const testing::StreamResult served = testing::Generate(*stub, req);
    ASSERT_TRUE(served.status.ok()) << served.status.error_message();
    EXPECT_EQ(served.tokens, testing::ReferenceTokens(**engine, req)) << served.text;
    EXPECT_EQ(served.final.finish_reason(), v1::FINISH_REASON_STOP) << served.text;
    const nlohmann::json j = nlohmann::json::parse(served.text, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("n") && j.contains("w")) << served.text;
  }
}

}  // namespace
}  // namespace tandem
