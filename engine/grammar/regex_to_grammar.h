// The regex front end: the regular expression subset structured output needs, as a
// grammar whose language is the strings the regex matches in full (Python's
// re.fullmatch), encoded as UTF-8.
//
// Supported: concatenation, `|`, groups `(...)`, `(?:...)`, `(?P<name>...)`,
// `(?<name>...)`; classes `[...]`, `[^...]` with ranges and escapes; `.`; `\d \w \s` and
// `\D \W \S`; quantifiers `* + ? {m} {m,} {m,n} {,n}` and their lazy forms (`*?` ...,
// the same language under full matching); escapes `\n \t \r \f \v \a \0 \xhh \uhhhh
// \Uhhhhhhhh` and any escaped punctuation; `^` as the first and `$` as the last
// character (no-ops under full matching). Anything else is INVALID_ARGUMENT naming it
// and its offset: backreferences, lookahead and lookbehind, inline flags, word
// boundaries and other anchors, Unicode property classes, possessive quantifiers.
//
// Dialects: kPython is Python's `re` with re.ASCII (`\d` [0-9], `\w` [A-Za-z0-9_], `\s`
// [ \t\n\r\f\v]; `.` any code point but \n). kEcmaScript is JSON Schema's `pattern`
// (ECMA-262 with the u flag, as ajv tests it): `\s` is ECMA's Unicode white space and
// line terminators, `.` excludes \n \r U+2028 U+2029, `[]` matches nothing and `[^]`
// anything, and unless `search` is false the pattern may match anywhere in the string
// (a missing `^` or `$` means any text may come before or after).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

enum class RegexDialect { kPython, kEcmaScript };

struct RegexOptions {
  RegexDialect dialect = RegexDialect::kPython;
  // Unanchored (search) semantics: what JSON Schema's `pattern` means. Full match
  // otherwise.
  bool search = false;
};

// The regex as one Expr (a rule body for other front ends).
absl::StatusOr<Expr> RegexToExpr(std::string_view pattern, const RegexOptions& options = {});

// A grammar with the single rule "root" matching what the regex matches.
absl::StatusOr<Grammar> RegexToGrammar(std::string_view pattern, const RegexOptions& options = {});

}  // namespace tandem::grammar
