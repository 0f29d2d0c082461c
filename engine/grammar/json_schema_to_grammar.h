// The JSON schema front end: a grammar of the JSON texts a schema accepts (draft
// 2020-12 semantics, as Ajv2020 validates), written with one whitespace style.
//
// Supported keywords and what is exact:
// - `type` (a name or a list); without `type`, the types the other keywords constrain
//   (object, array, string or number keywords), or any value when there are none. (JSON
//   Schema would also accept the other types there; structured output wants the ones
//   the keywords describe.)
// - `enum`, `const` (with `type` filtering the values; other value keywords beside them
//   are refused).
// - Objects: `properties` in the schema's order, `required` ones always present and the
//   others each optional, then additional properties (names not among `properties`,
//   written without escapes) when `additionalProperties` is true (the default, or false
//   in strict mode) or a schema; `required` names missing from `properties` are required
//   members with the `additionalProperties` schema.
// - Arrays: `prefixItems`, `items` (a schema or a boolean: the items after the prefix),
//   `minItems`, `maxItems`.
// - `$ref` to "#" or a JSON pointer within the document ("#/$defs/x",
//   "#/definitions/x", ...), recursion included; `$defs` / `definitions` hold targets.
// - `anyOf`; `oneOf` exactly when its branches are disjoint by type or by the `const` or
//   `enum` values of a property every branch requires, otherwise as anyOf (an
//   over-approximation: a text matching two branches is accepted; refused instead with
//   refuse_overlapping_one_of).
// - Strings: `minLength` / `maxLength` (code points; an escape sequence is one);
//   `pattern` (ECMAScript, unanchored unless ^ and $ say so, through the regex front
//   end; characters that JSON must escape are written escaped); `format` date, time,
//   date-time, email, uuid, ipv4, each a subset of what ajv-formats accepts: date exact
//   (leap years included); time and date-time with seconds, an optional fraction and a
//   "Z" or "+HH:MM" offset (no leap seconds, no "z", no offsets without minutes);
//   email in ajv's own form with ASCII letters of either case; uuid without the
//   "urn:uuid:" prefix; ipv4 exact. Format and pattern content is written without
//   escapes. Pattern or format together with a length bound is refused (an
//   intersection the grammar does not build).
// - Numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`. Integers:
//   exact (decimal digit-range grammars). Numbers: exact for integer bounds, written
//   without an exponent when bounded; a fractional bound is tightened to the integer
//   inside it (3.5 as a minimum allows 4 and above: every output is valid, some valid
//   numbers are refused). `integer` is written without a fraction or exponent (so 1.0
//   is refused although JSON Schema accepts it). Bounds beyond int64 are refused.
// - Annotations (`title`, `description`, `default`, `examples`, `$schema`, `$id`,
//   `$comment`, `deprecated`, `readOnly`, `writeOnly`, `contentEncoding`,
//   `contentMediaType`) are accepted and change nothing.
// Any other keyword is INVALID_ARGUMENT naming it and where it is (a JSON pointer);
// nothing is silently ignored. Strings in any position may use every JSON escape,
// except where noted above.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

struct JsonSchemaOptions {
  enum class Whitespace {
    kPython,   // json.dumps' defaults: ", " between items and members, ": " after keys
    kCompact,  // "," and ":"
  };
  Whitespace whitespace = Whitespace::kPython;
  // A missing additionalProperties means none (OpenAI's strict mode); by JSON Schema it
  // means any.
  bool strict = false;
  bool refuse_overlapping_one_of = false;
};

// Errors: INVALID_ARGUMENT for malformed JSON, unsupported keywords or combinations,
// unresolvable references and schemas that accept nothing, each with a JSON pointer.
absl::StatusOr<Grammar> JsonSchemaToGrammar(std::string_view schema, const JsonSchemaOptions& options = {});
absl::StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema,
                                            const JsonSchemaOptions& options = {});

// A rule of an EBNF grammar defined by a JSON schema (EbnfGrammar.json_rules).
struct JsonSchemaRule {
  std::string name;
  std::string schema;
  bool strict = false;  // JsonSchemaOptions::strict for this schema
};

// Adds rule `name`, matching the JSON texts `schema` accepts, to `builder`, with helper
// rules named "name#..." and the shared "json:..." ones (added once per builder: every
// schema of one builder must have the same whitespace). Errors: as JsonSchemaToGrammar's
// (a schema that accepts nothing shows when the builder builds), and `name` taken.
absl::Status AddJsonSchemaRule(std::string_view name, std::string_view schema, const JsonSchemaOptions& options,
                               GrammarBuilder* builder);

// OpenAI's json_object mode: any JSON object.
Grammar JsonObjectGrammar(const JsonSchemaOptions& options = {});

}  // namespace tandem::grammar
