// The per-request state of a constrained generation: which tokens the grammar allows
// next, and the tokens accepted so far (with rollback, for speculative decoding).
//
//   GrammarMatcher m(compiled);
//   m.FillNextTokenBitmask(mask);   // before sampling
//   m.AcceptToken(sampled);         // after it
//
// Allowed next tokens: exactly the tokens whose bytes keep the input a prefix of a
// sentence of the grammar; the end tokens (GrammarVocabulary::end_tokens) exactly when
// the input so far is a sentence; a special token exactly where a token terminal names it
// (grammar.h). Once an end token is accepted the matcher is terminated and allows nothing.
//
// Not thread-safe; one per request. The compiled grammar is shared and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/earley_recognizer.h"
#include "engine/grammar/token_walker.h"

namespace tandem::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Accepts a token if the grammar allows it; otherwise returns false and changes
  // nothing.
  bool AcceptToken(int32_t token);
  // Accepts bytes that are not one token (a forced prefix, tests); they count as one
  // token for Rollback. All or nothing, like AcceptToken.
  bool AcceptBytes(std::string_view bytes);
  // Takes back the last `num_tokens` accepted tokens (at most num_tokens()).
  void Rollback(int num_tokens);
  int num_tokens() const { return static_cast<int>(history_.size()); }

  // Whether the input so far is a sentence (an end token is allowed).
  bool CanEnd() const { return !terminated_ && rec_.CanEnd(); }
  bool IsTerminated() const { return terminated_; }

  // Writes the allowed next tokens into `bitmask` (bit i % 32 of word i / 32 for token
  // i; at least vocabulary().mask_words() words; words beyond are zeroed).
  void FillNextTokenBitmask(std::span<uint32_t> bitmask);

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Accepted {
    uint32_t sets_before;
    bool end_token;
  };

  std::shared_ptr<const CompiledGrammar> grammar_;
  EarleyRecognizer rec_;
  TokenWalker walker_;
  std::vector<Accepted> history_;
  bool terminated_ = false;
  // Scratch of FillNextTokenBitmask.
  std::vector<uint32_t> entry_stamp_;
  uint32_t stamp_ = 0;
  struct Pending {
    int32_t entry;
    int32_t origin;
    int32_t pos;
    bool operator==(const Pending&) const = default;
  };
  std::vector<Pending> pending_;
  std::vector<int32_t> origins_, next_origins_;
  std::vector<EarleyRecognizer::Item> seeds_;
  std::vector<int32_t> accepted_;
};

}  // namespace tandem::grammar
