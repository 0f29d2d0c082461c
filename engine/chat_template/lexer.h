// Splits a template into tokens exactly as Jinja2's lexer does with the options
// transformers sets (trim_blocks, lstrip_blocks, no keep_trailing_newline): newlines
// normalized to "\n" and one trailing newline dropped; `{%- -%}`, `{{- -}}`, `{#- -#}`
// strip whitespace; `{%+` keeps it; trim_blocks drops the newline after a block or
// comment tag (`+%}` keeps it); lstrip_blocks drops the indentation before one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat_template_internal {

enum class TokenType { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInteger, kFloat, kOp, kEnd };

struct Token {
  TokenType type;
  std::string value;  // text, name, operator, decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // into the normalized source
};

// The source after Jinja2's newline normalization, which token offsets refer to.
std::string NormalizeNewlines(std::string_view source);

// Tokens of `normalized` (NormalizeNewlines' output), ending with kEnd. Comments are
// dropped. Errors: INVALID_ARGUMENT "line L, column C: ..." (an unclosed tag, comment or
// string, a bad escape, an unexpected character, unbalanced brackets).
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view normalized);

// "line L, column C" of a byte offset (columns count code points, from 1).
std::string Position(std::string_view normalized, size_t offset);

}  // namespace tandem::chat_template_internal
