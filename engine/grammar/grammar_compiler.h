// Compiles structured-output constraints (JSON schema, json_object, regex, EBNF) for
// one vocabulary, keeping the most recently used results: a request whose constraint
// was compiled before reuses it (keyed by the constraint's kind, options and text).
//
// Every compile takes a deadline; past it the compile fails, so a hostile schema costs
// at most that much of a compile thread (the server passes now + its
// --grammar-compile-timeout-ms). Failures are not cached.
//
// Thread-safe: compiles run outside the lock; two threads compiling the same new
// constraint both compile it, and one result is kept.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "engine/grammar/vocabulary.h"

namespace tandem::grammar {

struct GrammarCompilerOptions {
  size_t cache_capacity = 64;  // compiled grammars kept; 0 disables the cache
  RuleTableOptions table;
};

class GrammarCompiler {
 public:
  using Options = GrammarCompilerOptions;
  struct CacheStats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    size_t size = 0;
  };

  explicit GrammarCompiler(std::shared_ptr<const GrammarVocabulary> vocabulary, Options options = {});

  // Errors, all INVALID_ARGUMENT: the constraint is malformed or uses an unsupported
  // feature (the message names it), or compiling it passed `deadline`.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(std::string_view schema,
                                                                           const JsonSchemaOptions& options,
                                                                           absl::Time deadline);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonObject(const JsonSchemaOptions& options,
                                                                           absl::Time deadline);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileRegex(std::string_view pattern, absl::Time deadline);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileEbnf(std::string_view text, std::string_view root,
                                                                     absl::Time deadline);
  // With rules defined by JSON schemas besides the EBNF ones, written with `json`'s
  // whitespace (each rule's own strict).
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileEbnf(std::string_view text, std::string_view root,
                                                                     std::span<const JsonSchemaRule> json_rules,
                                                                     const JsonSchemaOptions& json,
                                                                     absl::Time deadline);

  CacheStats cache_stats() const;
  const std::shared_ptr<const GrammarVocabulary>& vocabulary() const { return vocab_; }

 private:
  // EBNF's <[N]>: token N's content, from the vocabulary.
  EbnfOptions TokenIds() const;
  template <typename Build>
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Cached(std::string key, Build build, absl::Time deadline);

  std::shared_ptr<const GrammarVocabulary> vocab_;
  Options options_;
  mutable std::mutex mu_;
  // Most recent first.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> index_;
  CacheStats stats_;
};

}  // namespace tandem::grammar
