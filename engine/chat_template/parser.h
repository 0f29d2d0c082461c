// Builds the statement tree of a template from its tokens, with Jinja2's grammar and
// operator precedence (including its quirks: `**` groups left to right, `-x|f` filters
// the negation, `not x is y` negates the test).
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat_template/ast.h"
#include "engine/chat_template/lexer.h"

namespace tandem::chat_template_internal {

// Nesting deeper than this (blocks or expressions) is refused, so parsing and rendering
// never exhaust the stack.
inline constexpr int kMaxParseDepth = 200;

// `normalized` is the source the tokens came from (for error positions). Errors:
// INVALID_ARGUMENT "line L, column C: ..." for syntax errors, unknown tags, tags this
// interpreter does not support (include, extends, import, call, raw, recursive loops,
// *args) and nesting past kMaxParseDepth.
absl::StatusOr<Body> Parse(std::string_view normalized, std::vector<Token> tokens);

}  // namespace tandem::chat_template_internal
