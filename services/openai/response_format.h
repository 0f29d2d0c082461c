// Structured output in an OpenAI-compatible request body, as the three families of
// clients send it, into one GenerateRequest.constraint:
//   - OpenAI: response_format {"type": "text" | "json_object" | "json_schema",
//     "json_schema": {"name", "schema", "strict"}} (strict: a missing
//     additionalProperties means none, as OpenAI's strict mode);
//   - vLLM: structured_outputs {"json" (a schema, object or string), "regex", "choice"
//     (a list of strings: exactly one of them), "grammar" (EBNF), "json_object": true},
//     and the older guided_json / guided_regex / guided_choice / guided_grammar fields;
//   - SGLang: flat "regex", "ebnf" and "json_schema" (a string) fields.
// At most one constraint per request; anything else is a 400 naming the field. What the
// constraint says is checked by the workers that compile it (a 400 from there too).
#pragma once

#include <optional>

#include "services/openai/json_fields.h"
#include "services/openai/openai_errors.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::openai {

std::optional<ApiError> ParseResponseFormat(const Json& body, v1::Constraint* out);

// The regex (Python syntax) matching exactly one of `choices`, each taken literally.
std::string ChoiceRegex(const std::vector<std::string>& choices);

}  // namespace tandem::openai
