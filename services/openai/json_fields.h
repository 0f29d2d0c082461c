// Reading a request body's fields as OpenAI's and vLLM's servers read them: absent and
// null both mean "not given", and a value of the wrong type is a 400 naming the field.
// Bodies keep their key order (ordered_json): tools reach the chat template as sent.
#pragma once

#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "services/openai/openai_errors.h"

namespace tandem::openai {

using Json = nlohmann::ordered_json;

// The field's value; null when absent or null.
const Json* Field(const Json& body, const char* name);

// 400 "NAME: must be WANT".
ApiError TypeError(const std::string& name, const char* want);

// A boolean field; sets *error for another type.
std::optional<bool> Bool(const Json& body, const char* name, std::optional<ApiError>* error);

}  // namespace tandem::openai
