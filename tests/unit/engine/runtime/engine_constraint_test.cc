// Structured output through the engine (EngineRequest::constraint): outputs of a random
// tiny model, greedy and sampled, checked by checkers the grammar engine does not share
// (std::regex_match, nlohmann::json); a special token named by the grammar; refusals;
// cancellation while compiling; resumed and imported requests rebuilding the matcher;
// constrained rows beside pipelined ones.
#include <algorithm>
#include <map>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/device_sampling_cpu_backend.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Tokens;

std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}, bool pipelined = false) {
  o.num_threads = 2;
  if (pipelined) {
    o.backend_factory = [](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      absl::StatusOr<std::unique_ptr<DeepseekModel>> m = DeepseekModel::Load(dir, {.num_threads = 2});
      if (!m.ok()) return m.status();
      return std::make_unique<testing::DeviceSamplingCpuBackend>(std::move(*m), /*defer=*/true);
    };
  }
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

using testing::Drain;
using testing::Result;

OutputConstraint Regex(std::string pattern) {
  return {.kind = OutputConstraint::Kind::kRegex, .text = std::move(pattern)};
}

EngineRequest Req(std::string id, int salt, OutputConstraint c, std::optional<uint64_t> seed, int max_tokens = 96) {
  EngineRequest r;
  r.id = std::move(id);
  r.prompt = Tokens(12 + salt % 7, salt);
  r.sampling.temperature = seed ? 1.0f : 0.0f;
  r.sampling.seed = seed;
  r.stop.max_tokens = max_tokens;
  r.constraint = std::move(c);
  return r;
}

Result RunToEnd(Engine& e, EngineRequest r) {
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? Drain(**s) : Result{};
}

TEST(EngineConstraintTest, RegexOutputsMatchGreedyAndSampled) {
  auto e = MakeEngine();
  // (pattern for the grammar, the same language for std::regex (ECMAScript))
  const std::vector<std::pair<std::string, std::string>> patterns = {
      {"[a-z]{3}-[0-9]{2,4}", "[a-z]{3}-[0-9]{2,4}"},
      {"(yes|no|maybe)", "(yes|no|maybe)"},
      {"\\d+\\.\\d\\d", "[0-9]+\\.[0-9][0-9]"},
      {"[A-Z][a-z]* [A-Z][a-z]*", "[A-Z][a-z]* [A-Z][a-z]*"},
      {"(ab|cd)*e", "(ab|cd)*e"},
  };
  int n = 0;
  size_t tokens = 0;
  for (const auto& [pattern, check] : patterns) {
    for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(11),
                                         std::optional<uint64_t>(12), std::optional<uint64_t>(13)}) {
      const Result r = RunToEnd(*e, Req("r" + std::to_string(n), n, Regex(pattern), seed, 200));
      ++n;
      tokens += r.tokens.size();
      ASSERT_TRUE(r.final.status.ok()) << r.final.status;
      if (r.final.finish_reason == FinishReason::kLength) {
        // Sampling may wander through an unbounded repetition; what came out must still
        // be a prefix (checked by extending it is not possible with std::regex, so only
        // the bounded patterns require the end).
        EXPECT_TRUE(pattern.find('*') != std::string::npos || pattern.find('+') != std::string::npos) << pattern;
        continue;
      }
      EXPECT_EQ(r.final.finish_reason, FinishReason::kStop);
      EXPECT_TRUE(std::regex_match(r.text, std::regex(check))) << pattern << " -> '" << r.text << "'";
    }
  }
  // Every token was chosen under a constraint; each pattern compiled once, then found.
  EXPECT_EQ(e->Stats().constrained_tokens, static_cast<int64_t>(tokens));
  EXPECT_EQ(e->Stats().constraint_cache_hits, 15);
  EXPECT_EQ(e->Stats().constraints_compiled, 20);
}

TEST(EngineConstraintTest, JsonSchemaOutputsParseAndHoldTheSchema) {
  auto e = MakeEngine();
  const std::string schema = R"({"type": "object", "properties": {
      "id": {"type": "integer", "minimum": 0, "maximum": 999},
      "tag": {"enum": ["red", "green", "blue"]},
      "ok": {"type": "boolean"},
      "name": {"type": "string", "maxLength": 4}},
    "required": ["id", "tag", "ok", "name"], "additionalProperties": false})";
  for (int i = 0; i < 6; ++i) {
    const Result r = RunToEnd(*e, Req("j" + std::to_string(i), 50 + i,
                                 {.kind = OutputConstraint::Kind::kJsonSchema, .text = schema},
                                 i == 0 ? std::nullopt : std::optional<uint64_t>(i), 400));
    ASSERT_TRUE(r.final.status.ok()) << r.final.status;
    ASSERT_EQ(r.final.finish_reason, FinishReason::kStop) << r.text;
    const nlohmann::json j = nlohmann::json::parse(r.text, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << r.text;
    EXPECT_EQ(j.size(), 4u) << r.text;
    ASSERT_TRUE(j["id"].is_number_integer()) << r.text;
    EXPECT_GE(j["id"].get<int64_t>(), 0);
    EXPECT_LE(j["id"].get<int64_t>(), 999);
    EXPECT_TRUE(j["tag"] == "red" || j["tag"] == "green" || j["tag"] == "blue") << r.text;
    EXPECT_TRUE(j["ok"].is_boolean()) << r.text;
    ASSERT_TRUE(j["name"].is_string()) << r.text;
    EXPECT_LE(j["name"].get<std::string>().size(), 4u * 4) << r.text;  // 4 code points
    // json.dumps' separators by default.
    EXPECT_EQ(r.text.rfind("{\"id\": ", 0), 0u) << r.text;
  }
}

TEST(EngineConstraintTest, JsonObjectModeGivesAnObject) {
  auto e = MakeEngine();
  for (int i = 0; i < 4; ++i) {
    const Result r = RunToEnd(*e, Req("o" + std::to_string(i), 70 + i, {.kind = OutputConstraint::Kind::kJsonObject},
                                 std::optional<uint64_t>(100 + i), 600));
    ASSERT_TRUE(r.final.status.ok()) << r.final.status;
    if (r.final.finish_reason != FinishReason::kStop) continue;  // a random model may nest deeply
    const nlohmann::json j = nlohmann::json::parse(r.text, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.text;
  }
}

TEST(EngineConstraintTest, EbnfGrammar) {
  auto e = MakeEngine();
  const std::string g = R"(root ::= greeting " " name "!"
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z] [a-z]?)";
  for (int i = 0; i < 5; ++i) {
    const Result r = RunToEnd(*e, Req("g" + std::to_string(i), 90 + i, {.kind = OutputConstraint::Kind::kEbnf, .text = g},
                                 i ? std::optional<uint64_t>(i) : std::nullopt));
    ASSERT_TRUE(r.final.status.ok()) << r.final.status;
    EXPECT_EQ(r.final.finish_reason, FinishReason::kStop);
    EXPECT_TRUE(std::regex_match(r.text, std::regex("(hi|hello) [A-Z][a-z][a-z]?!"))) << r.text;
  }
}

TEST(EngineConstraintTest, ASpecialTokenComesExactlyWhereTheGrammarNamesIt) {
  // The host path and the pipelined "device" path (the same bitmask, applied by the
  // backend), greedy and sampled.
  for (const bool pipelined : {false, true}) {
    auto e = MakeEngine({}, pipelined);
    const std::optional<int32_t> pad = e->tokenizer().TokenToId("<｜▁pad▁｜>");
    ASSERT_TRUE(pad.has_value());
    const std::string g = "root ::= [a-z]{2,4} <｜▁pad▁｜> [0-9]{1,2} | \"<｜▁pad▁｜>\" [a-z]";
    int with_token = 0;
    for (int i = 0; i < 6; ++i) {
      SCOPED_TRACE(absl::StrCat(pipelined ? "pipelined " : "host ", i));
      EngineRequest r = Req("t" + std::to_string(i), 40 + i, {.kind = OutputConstraint::Kind::kEbnf, .text = g},
                            i ? std::optional<uint64_t>(i) : std::nullopt);
      r.stop.skip_special_tokens = false;
      const Result out = RunToEnd(*e, std::move(r));
      ASSERT_TRUE(out.final.status.ok()) << out.final.status;
      EXPECT_EQ(out.final.finish_reason, FinishReason::kStop) << out.text;
      // Either the token between letters and digits, or its text spelled out before a
      // letter: never the token there, never the text in the token's place.
      const auto at = std::find(out.tokens.begin(), out.tokens.end(), *pad);
      if (at != out.tokens.end()) {
        ++with_token;
        EXPECT_EQ(std::count(out.tokens.begin(), out.tokens.end(), *pad), 1);
        EXPECT_TRUE(std::regex_match(out.text, std::regex("[a-z]{2,4}<｜▁pad▁｜>[0-9]{1,2}"))) << out.text;
      } else {
        EXPECT_TRUE(std::regex_match(out.text, std::regex("<｜▁pad▁｜>[a-z]"))) << out.text;
        EXPECT_GT(out.tokens.size(), 2u) << "the text takes ordinary tokens";
      }
    }
    EXPECT_GT(with_token, 0) << "no output took the token's branch";
  }
}

TEST(EngineConstraintTest, RefusedConstraintsNameTheProblem) {
  auto e = MakeEngine();
  struct Case {
    OutputConstraint c;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{.kind = OutputConstraint::Kind::kJsonSchema, .text = R"({"type": "string", "contentSchema": {}})"},
       "contentSchema"},
      {{.kind = OutputConstraint::Kind::kJsonSchema, .text = "{not json"}, "constraint.json_schema"},
      {Regex("(unclosed"), "constraint.regex"},
      {{.kind = OutputConstraint::Kind::kEbnf, .text = "root ::= missing"}, "missing"},
      {{.kind = OutputConstraint::Kind::kEbnf, .text = "x ::= \"a\"", .root = "root"}, "root"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const Result r = RunToEnd(*e, Req("bad" + std::to_string(i++), i, c.c, std::nullopt));
    EXPECT_EQ(r.final.status.code(), absl::StatusCode::kInvalidArgument) << c.expect << ": " << r.final.status;
    EXPECT_NE(r.final.status.message().find(c.expect), std::string::npos) << r.final.status;
    EXPECT_TRUE(r.tokens.empty());
  }
  // Refused before queuing: empty or oversize text.
  EXPECT_EQ(e->Submit(Req("empty", 1, Regex(""), std::nullopt)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Req("huge", 1, Regex(std::string(kMaxConstraintBytes + 1, 'a')), std::nullopt)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Stats().constraints_failed, 5);  // the two refused at Submit never compiled
  // The engine still serves.
  EXPECT_TRUE(RunToEnd(*e, Req("after", 3, Regex("ok"), std::nullopt)).final.status.ok());
}

TEST(EngineConstraintTest, CompileTimeoutIsInvalidArgument) {
  auto e = MakeEngine({.grammar_compile_timeout_s = 0.001});
  // Long bounded strings compile slowly (docs/performance.md): far past 1 ms.
  const std::string schema = R"({"type": "string", "minLength": 400, "maxLength": 900})";
  const Result r = RunToEnd(*e, Req("slow", 1, {.kind = OutputConstraint::Kind::kJsonSchema, .text = schema}, std::nullopt));
  EXPECT_EQ(r.final.status.code(), absl::StatusCode::kInvalidArgument) << r.final.status;
  EXPECT_NE(r.final.status.message().find("--grammar-compile-timeout-ms"), std::string::npos) << r.final.status;
}

TEST(EngineConstraintTest, MaxTokensEndsWithLengthAndAPrefix) {
  auto e = MakeEngine();
  const Result r = RunToEnd(*e, Req("short", 5, Regex("[a-c]{20}"), std::nullopt, 6));
  ASSERT_TRUE(r.final.status.ok());
  EXPECT_EQ(r.final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(r.tokens.size(), 6u);
  EXPECT_TRUE(std::regex_match(r.text, std::regex("[a-c]{1,20}"))) << r.text;
}

TEST(EngineConstraintTest, IgnoreEosStillEndsWhereTheGrammarEnds) {
  auto e = MakeEngine();
  EngineRequest req = Req("ign", 6, Regex("done"), std::nullopt);
  req.stop.ignore_eos = true;
  const Result r = RunToEnd(*e, std::move(req));
  ASSERT_TRUE(r.final.status.ok());
  EXPECT_EQ(r.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(r.text, "done");
}

TEST(EngineConstraintTest, MinTokensYieldsToACompleteGrammar) {
  auto e = MakeEngine();
  EngineRequest req = Req("min", 7, Regex("a"), std::nullopt);
  req.stop.min_tokens = 5;
  const Result r = RunToEnd(*e, std::move(req));
  ASSERT_TRUE(r.final.status.ok()) << r.final.status;
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(r.final.finish_reason, FinishReason::kStop);
}

TEST(EngineConstraintTest, ResumedRequestContinuesTheSameAndRefusesForeignTokens) {
  auto e = MakeEngine();
  const OutputConstraint c = Regex("[a-z]{4}[0-9]{4}");
  const Result whole = RunToEnd(*e, Req("whole", 8, c, 42));
  ASSERT_TRUE(whole.final.status.ok());
  ASSERT_GE(whole.tokens.size(), 4u);
  EngineRequest resumed = Req("resumed", 8, c, 42);
  resumed.resume_tokens.assign(whole.tokens.begin(), whole.tokens.begin() + 3);
  const Result rest = RunToEnd(*e, std::move(resumed));
  ASSERT_TRUE(rest.final.status.ok()) << rest.final.status;
  EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + 3, whole.tokens.end()));

  // A digit first breaks the pattern.
  EngineRequest foreign = Req("foreign", 8, c, 42);
  foreign.resume_tokens = e->tokenizer().Encode("1", /*add_special_tokens=*/false);
  const Result bad = RunToEnd(*e, std::move(foreign));
  EXPECT_EQ(bad.final.status.code(), absl::StatusCode::kInvalidArgument) << bad.final.status;
  EXPECT_NE(bad.final.status.message().find("resume_tokens[0]"), std::string::npos) << bad.final.status;
}

TEST(EngineConstraintTest, CancelWhileCompilingEndsTheRequest) {
  // A compile that takes seconds, then Cancel: the request ends CANCELLED at once, and
  // the engine's shutdown does not wait for anything of it.
  auto e = MakeEngine({.grammar_compile_timeout_s = 30});
  const std::string schema = R"({"type": "string", "minLength": 500, "maxLength": 1500})";
  auto s = e->Submit(Req("c", 1, {.kind = OutputConstraint::Kind::kJsonSchema, .text = schema}, std::nullopt));
  ASSERT_TRUE(s.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  e->Cancel("c");
  const Result r = Drain(**s);
  EXPECT_EQ(r.final.status.code(), absl::StatusCode::kCancelled) << r.final.status;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(EngineConstraintTest, PrefillThenImportedDecodeMatchesOneEngine) {
  const OutputConstraint c = Regex("[a-z]{2,6}(, [a-z]{2,6}){3}");
  for (std::optional<uint64_t> seed : {std::optional<uint64_t>(), std::optional<uint64_t>(5)}) {
    auto single = MakeEngine();
    const Result reference = RunToEnd(*single, Req("x", 30, c, seed));
    ASSERT_TRUE(reference.final.status.ok());

    class Sink : public KvSink {
     public:
      void OnLayerKv(const KvSlice& kv) override {
        for (int64_t p = kv.begin; p < kv.end; ++p) {
          const float* src = kv.Entry(p);
          auto& dst = layers[kv.layer];
          dst.insert(dst.end(), src, src + kv.entry_dim);
        }
      }
      std::map<int64_t, std::vector<float>> layers;
    } sink;
    auto p = MakeEngine();
    EngineRequest pre = Req("x", 30, c, seed);
    pre.kv_sink = &sink;
    const Result first = RunToEnd(*p, std::move(pre));
    ASSERT_EQ(first.tokens.size(), 1u);
    EXPECT_EQ(first.tokens[0], reference.tokens[0]);

    auto d = MakeEngine();
    const EngineRequest dr = Req("x", 30, c, seed);
    absl::StatusOr<std::vector<int32_t>> blocks = d->ReserveKv("x", static_cast<int32_t>(dr.prompt.size()));
    ASSERT_TRUE(blocks.ok());
    for (auto& [layer, flat] : sink.layers) ASSERT_TRUE(d->WriteKv(*blocks, layer, 0, flat).ok());
    auto ds = d->SubmitImported(dr, first.tokens[0]);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Result decoded = Drain(**ds);
    EXPECT_EQ(decoded.tokens, reference.tokens);
    EXPECT_EQ(decoded.text, reference.text);

    // A first token the constraint refuses ("9") is refused with the request.
    auto d2 = MakeEngine();
    ASSERT_TRUE(d2->ReserveKv("x", static_cast<int32_t>(dr.prompt.size())).ok());
    const int32_t nine = d2->tokenizer().Encode("9", false).at(0);
    EXPECT_EQ(d2->SubmitImported(dr, nine).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(EngineConstraintTest, ConstrainedBesidePipelinedRequests) {
  // Unconstrained greedy requests give the same tokens whether constrained ones share
  // their steps (sampled "on the device" with their masks, pipelined) or not.
  auto alone = MakeEngine({}, /*pipelined=*/true);
  std::vector<Result> reference;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = Req("u" + std::to_string(i), 200 + i, {}, std::nullopt, 24);
    r.stop.ignore_eos = true;
    reference.push_back(RunToEnd(*alone, std::move(r)));
  }
  auto mixed = MakeEngine({}, /*pipelined=*/true);
  std::vector<std::shared_ptr<OutputStream>> u, k;
  size_t all_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = Req("u" + std::to_string(i), 200 + i, {}, std::nullopt, 24);
    r.stop.ignore_eos = true;
    u.push_back(*mixed->Submit(std::move(r)));
    k.push_back(*mixed->Submit(Req("k" + std::to_string(i), 300 + i, Regex("[0-9]{6}"), 9 + i)));
  }
  for (int i = 0; i < 4; ++i) {
    const Result ur = Drain(*u[i]);
    EXPECT_EQ(ur.tokens, reference[i].tokens) << i;
    const Result kr = Drain(*k[i]);
    all_tokens += ur.tokens.size() + kr.tokens.size();
    EXPECT_TRUE(std::regex_match(kr.text, std::regex("[0-9]{6}"))) << kr.text;
  }
  // Every token, the constrained rows' included, was chosen "on the device" (their masks
  // applied there).
  EXPECT_EQ(mixed->Stats().device_sampled_tokens, static_cast<int64_t>(all_tokens));
}

TEST(EngineConstraintTest, MasksFilledOnSeveralThreadsGiveTheSameTokens) {
  // Device-sampling steps fill their constrained rows' masks on grammar_mask_threads
  // threads: eight seeded constrained requests sharing steps give the tokens they give with
  // one thread.
  auto run = [](int threads) {
    EngineOptions o;
    o.grammar_mask_threads = threads;
    auto e = MakeEngine(o, /*pipelined=*/true);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 8; ++i) {
      OutputConstraint c = i % 2 ? Regex("[a-z]{2,5}(-[0-9]{1,3}){1,4}")
                                 : OutputConstraint{.kind = OutputConstraint::Kind::kJsonObject};
      streams.push_back(*e->Submit(Req("m" + std::to_string(i), 400 + i, std::move(c), 21 + i, 64)));
    }
    std::vector<Result> results;
    for (auto& s : streams) results.push_back(Drain(*s));
    EXPECT_GT(e->Stats().device_sampled_tokens, 0);
    return results;
  };
  const std::vector<Result> one = run(1), four = run(4);
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_TRUE(four[i].final.status.ok()) << four[i].final.status;
    EXPECT_EQ(four[i].tokens, one[i].tokens) << i;
    if (i % 2 && four[i].final.finish_reason != FinishReason::kLength) {
      EXPECT_TRUE(std::regex_match(four[i].text, std::regex("[a-z]{2,5}(-[0-9]{1,3}){1,4}"))) << four[i].text;
    }
  }
}

}  // namespace
}  // namespace tandem
