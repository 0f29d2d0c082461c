#include "engine/grammar/grammar_compiler.h"

#include "absl/strings/str_cat.h"
#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/json_schema_to_grammar.h"
#include "engine/grammar/regex_to_grammar.h"

namespace tandem::grammar {
namespace {

std::string JsonOptionsKey(const JsonSchemaOptions& o) {
  return absl::StrCat(o.whitespace == JsonSchemaOptions::Whitespace::kCompact ? "c" : "p", o.strict ? "s" : "-",
                      o.refuse_overlapping_one_of ? "o" : "-");
}

}  // namespace

GrammarCompiler::GrammarCompiler(std::shared_ptr<const GrammarVocabulary> vocabulary, Options options)
    : vocab_(std::move(vocabulary)), options_(options) {}

template <typename Build>
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Cached(std::string key, Build build,
                                                                               absl::Time deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->second;
    }
    ++stats_.misses;
  }
  absl::StatusOr<Grammar> grammar = build();
  if (!grammar.ok()) return grammar.status();
  CompileOptions o;
  o.deadline = deadline;
  o.table = options_.table;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = CompiledGrammar::Compile(*grammar, vocab_, o);
  if (!compiled.ok() || options_.cache_capacity == 0) return compiled;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // another thread won
  lru_.emplace_front(key, *compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > options_.cache_capacity) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

EbnfOptions GrammarCompiler::TokenIds() const {
  return {.token_by_id = [v = vocab_](int64_t id) -> absl::StatusOr<std::string> {
    if (id >= v->size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary (", v->size(),
                                                     " tokens)"));
    }
    const int32_t i = static_cast<int32_t>(id);
    if (!v->is_special(i)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is a text token: name it by its text"));
    }
    std::optional<std::string> name = v->SpecialTokenName(i);
    if (!name) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is a special token a grammar cannot name "
                                                     "(empty, or its content is an earlier token's)"));
    }
    return *std::move(name);
  }};
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileJsonSchema(
    std::string_view schema, const JsonSchemaOptions& options, absl::Time deadline) {
  return Cached(absl::StrCat("json_schema|", JsonOptionsKey(options), "|", std::string(schema)),
                [&] { return JsonSchemaToGrammar(schema, options); }, deadline);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileJsonObject(
    const JsonSchemaOptions& options, absl::Time deadline) {
  return Cached(absl::StrCat("json_object|", JsonOptionsKey(options)),
                [&]() -> absl::StatusOr<Grammar> { return JsonObjectGrammar(options); }, deadline);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileRegex(std::string_view pattern,
                                                                                     absl::Time deadline) {
  return Cached(absl::StrCat("regex|", std::string(pattern)), [&] { return RegexToGrammar(pattern); }, deadline);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileEbnf(std::string_view text,
                                                                                    std::string_view root,
                                                                                    absl::Time deadline) {
  return Cached(absl::StrCat("ebnf|", std::string(root), "|", std::string(text)),
                [&] { return ParseEbnf(text, root, TokenIds()); }, deadline);
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileEbnf(
    std::string_view text, std::string_view root, std::span<const JsonSchemaRule> json_rules,
    const JsonSchemaOptions& json, absl::Time deadline) {
  if (json_rules.empty()) return CompileEbnf(text, root, deadline);
  std::string key = absl::StrCat("ebnf+json|", JsonOptionsKey(json), "|", std::string(root), "|", text.size(), "|",
                                 std::string(text));
  for (const JsonSchemaRule& r : json_rules) {
    absl::StrAppend(&key, "|", r.name.size(), ":", r.name, r.strict ? "s" : "-", r.schema.size(), ":", r.schema);
  }
  return Cached(std::move(key), [&]() -> absl::StatusOr<Grammar> {
    GrammarBuilder builder;
    if (absl::Status s = ParseEbnfRules(text, &builder, TokenIds()); !s.ok()) return s;
    for (const JsonSchemaRule& r : json_rules) {
      JsonSchemaOptions o = json;
      o.strict = r.strict;
      if (absl::Status s = AddJsonSchemaRule(r.name, r.schema, o, &builder); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("json rule '", r.name, "': ", s.message()));
      }
    }
    return std::move(builder).Build(root);
  }, deadline);
}

GrammarCompiler::CacheStats GrammarCompiler::cache_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStats s = stats_;
  s.size = lru_.size();
  return s;
}

}  // namespace tandem::grammar
