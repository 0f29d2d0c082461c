// Grammar pieces for JSON values, shared by the JSON schema front end: separators,
// string content (raw characters and escapes, one code point per element so that
// lengths count code points as JSON Schema does), numbers and integer ranges, the
// supported string formats, any value, and JSON text of a literal value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar::json_values {

struct Separators {
  std::string item;  // between array items and object members: "," or ", "
  std::string key;   // between a key and its value: ":" or ": "
};

// Names of the shared rules below; AddSharedRules defines them in a builder.
inline constexpr char kCharRule[] = "json:char";      // one code point of string content
inline constexpr char kStringRule[] = "json:string";  // any string
inline constexpr char kValueRule[] = "json:value";    // any value
inline constexpr char kObjectRule[] = "json:object";  // any object
inline constexpr char kArrayRule[] = "json:array";    // any array
void AddSharedRules(const Separators& sep, GrammarBuilder* builder);

// A code point raw (anything but '"', '\\' and controls) or escaped (\" \\ \/ \b \f \n
// \r \t, \u of a non-surrogate, or a \u surrogate pair: one code point, so repetition
// bounds count code points). Lone surrogate escapes are refused (JSON.parse takes them,
// json.dumps never writes them).
Expr StringChar();
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
Expr Number();
// -?(0|[1-9][0-9]*)
Expr Integer();

// Inclusive integer bounds; nullopt is unbounded. Exact: the decimal integers in range,
// written without leading zeros (and without "-0").
Expr IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A bound on a number: value, and whether it excludes the value itself.
struct Bound {
  int64_t value = 0;
  bool exclusive = false;
};
// Decimal numbers x with lo <= x (or lo < x) and x <= hi (or x < hi), written as
// -?I(.F)? (no exponent, no "-0"); exact for these integer bounds.
Expr NumberRange(std::optional<Bound> lo, std::optional<Bound> hi);

// Content of strings of format "date", "time", "date-time", "email", "uuid", "ipv4"
// (see json_schema_to_grammar.h for the exact languages); NOT_FOUND for other names.
absl::StatusOr<Expr> FormatContent(std::string_view format);

// Rewrites an Expr over code points (a regex's) into JSON string content that decodes
// to the same strings: characters that JSON requires escaped are written as escapes
// ("\"", "\\", "\n", "\u0001", ...); the others raw.
Expr EscapeForJsonString(const Expr& content);

// JSON text of `value` with these separators; strings escaped as json.dumps does with
// ensure_ascii=False.
std::string Serialize(const nlohmann::ordered_json& value, const Separators& sep);
std::string QuoteString(std::string_view utf8);

// String content (no quotes, raw characters only) whose text differs from every one of
// `excluded` (UTF-8). Used for additional property names.
Expr ContentNotIn(const std::vector<std::string>& excluded);

}  // namespace tandem::grammar::json_values
