// A request's structured-output constraint as the engine takes it (EngineRequest::
// constraint): what every generated token must keep the output a prefix of, compiled by
// ConstraintCompiler (constraint_compiler.h) into a grammar the sampler masks logits with.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/json_schema_to_grammar.h"

namespace tandem {

struct OutputConstraint {
  enum class Kind {
    kNone,
    kJsonSchema,  // text: a JSON schema document
    kJsonObject,  // any JSON object (OpenAI's json_object mode); text unused
    kRegex,       // text: a pattern (Python re syntax), matched in full
    kEbnf,        // text: an EBNF grammar (ebnf_parser.h), from rule `root`
  };
  Kind kind = Kind::kNone;
  std::string text;
  std::string root = "root";
  // kEbnf: more rules, each defined by a JSON schema (written with json.whitespace).
  std::vector<grammar::JsonSchemaRule> json_rules;
  // oneOf with overlapping branches is refused rather than widened to anyOf: every
  // output must be valid by the schema.
  grammar::JsonSchemaOptions json = {.refuse_overlapping_one_of = true};

  bool active() const { return kind != Kind::kNone; }
};

// Bytes of a constraint's text beyond which it is refused before any compile work (a
// schema this large is a mistake or an attack; XGrammar and vLLM set no bound, the HTTP
// body limit bounds them).
inline constexpr size_t kMaxConstraintBytes = 256 * 1024;

absl::string_view KindName(OutputConstraint::Kind kind);

// INVALID_ARGUMENT "constraint...: ..." for an empty or oversize text (json rules'
// schemas count towards the size), an empty root, a text on json_object, json rules on a
// kind other than ebnf or without a name or schema. What the text says is checked by
// compiling it.
absl::Status Validate(const OutputConstraint& c);

// Sets every logit whose token the bitmask does not allow (bit i % 32 of word i / 32) to
// -inf; ids past the mask's words are disallowed too (a model vocabulary padded beyond
// the tokenizer's).
void MaskLogits(std::span<float> logits, std::span<const uint32_t> bitmask);

}  // namespace tandem
