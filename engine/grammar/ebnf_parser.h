// The EBNF front end: a GBNF-like text format (llama.cpp's grammar files, read as the
// format is documented; the parser is ours).
//
//   # a comment, to the end of the line
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   pair   ::= string ws ":" ws value
//   string ::= "\"" [^"\\\x00-\x1f]* "\""
//   digit  ::= [0-9]
//   id     ::= [a-zA-Z_] [a-zA-Z0-9_]{0,31}
//
// - A rule is `name ::= body`; names are letters, digits, `_` and `-`. A body may span
//   lines: it ends where the next `name ::=` begins.
// - Bodies: sequences of items, `|` between alternatives, `( ... )` groups.
// - Items: a rule name; a "literal" (UTF-8; escapes \n \r \t \\ \" \' \[ \] \- \/ \^
//   \xHH \uHHHH \UHHHHHHHH, the hex forms giving a code point); a class `[...]` of code
//   points and ranges `a-z` (`[^...]` for its complement), with the same escapes; `.`
//   for any code point; a special token (grammar.h, vocabulary.h): `<...>` names the
//   token whose content is that text, from `<` to the first `>` (no whitespace or
//   quotes inside), as `<｜tool▁sep｜>` or `<|im_end|>`; `@"..."` names any other
//   content, with the literal's escapes (`@"[INST]"`); `<[N]>` names the token of id N
//   (EbnfOptions::token_by_id resolves it to that token's content: a special or added
//   token; a text token is named by its text instead). Only the token matches there:
//   the text `"<｜tool▁sep｜>"` is ordinary text and never produces the token.
// - Postfix repetition: `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`.
// Errors are INVALID_ARGUMENT with the line and column (in bytes, 1-based) and what was
// expected; the grammar's own checks (grammar.h) name the rule and its line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

struct EbnfOptions {
  // `<[N]>`: the content of token N, or an error saying why N names no token a grammar
  // can name (INVALID_ARGUMENT). Unset: `<[N]>` is refused (ids need a vocabulary).
  std::function<absl::StatusOr<std::string>(int64_t id)> token_by_id;
};

absl::StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root = "root",
                                  const EbnfOptions& options = {});

// The rules of `text` added to `builder`, for grammars that define more rules by other
// means (JSON schema rules, json_schema_to_grammar.h). Errors as ParseEbnf's, the
// grammar's own checks left to Build.
absl::Status ParseEbnfRules(std::string_view text, GrammarBuilder* builder, const EbnfOptions& options = {});

}  // namespace tandem::grammar
