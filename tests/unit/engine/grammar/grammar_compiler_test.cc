// GrammarCompiler: the cache by content (hits, LRU eviction, failures not kept) and the
// deadline.
#include "engine/grammar/grammar_compiler.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/engine/grammar/test_vocabulary.h"

namespace tandem::grammar {
namespace {

const absl::Time kNoDeadline = absl::InfiniteFuture();

TEST(GrammarCompilerTest, CachesByContent) {
  GrammarCompiler c(testing::MakeTestVocabulary(600, 50, 1), {.cache_capacity = 2});
  auto a1 = c.CompileJsonSchema(R"({"type":"integer"})", {}, kNoDeadline);
  auto a2 = c.CompileJsonSchema(R"({"type":"integer"})", {}, kNoDeadline);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(a1->get(), a2->get());
  JsonSchemaOptions compact;
  compact.whitespace = JsonSchemaOptions::Whitespace::kCompact;
  auto a3 = c.CompileJsonSchema(R"({"type":"integer"})", compact, kNoDeadline);  // other options: other key
  ASSERT_TRUE(a3.ok());
  EXPECT_NE(a1->get(), a3->get());
  EXPECT_EQ(c.cache_stats().hits, 1u);
  EXPECT_EQ(c.cache_stats().misses, 2u);
  // Capacity 2: compiling a third evicts the least recently used (the first).
  auto r = c.CompileRegex("[a-z]+", kNoDeadline);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(c.cache_stats().size, 2u);
  auto a4 = c.CompileJsonSchema(R"({"type":"integer"})", {}, kNoDeadline);
  ASSERT_TRUE(a4.ok());
  EXPECT_NE(a1->get(), a4->get());
  auto r2 = c.CompileRegex("[a-z]+", kNoDeadline);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r->get(), r2->get());
  auto e1 = c.CompileEbnf("root ::= \"a\"", "root", kNoDeadline);
  auto o1 = c.CompileJsonObject({}, kNoDeadline);
  EXPECT_TRUE(e1.ok() && o1.ok());
}

TEST(GrammarCompilerTest, FailuresNameTheirCauseAndAreNotCached) {
  GrammarCompiler c(testing::MakeTestVocabulary(600, 50, 1));
  auto bad = c.CompileJsonSchema(R"({"type":"integer","multipleOf":3})", {}, kNoDeadline);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("multipleOf"), std::string::npos);
  EXPECT_EQ(c.cache_stats().size, 0u);
  // Past its deadline a compile fails; the same constraint compiles later with time.
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"string"}}})";
  auto late = c.CompileJsonSchema(schema, {}, absl::InfinitePast());
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(late.status().message()).find("longer to compile than its limit"), std::string::npos)
      << late.status();
  EXPECT_TRUE(c.CompileJsonSchema(schema, {}, kNoDeadline).ok());
  EXPECT_FALSE(c.CompileRegex("(a", kNoDeadline).ok());
  EXPECT_FALSE(c.CompileEbnf("root ::= x", "root", kNoDeadline).ok());
}

}  // namespace
}  // namespace tandem::grammar
