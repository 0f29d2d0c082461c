#include "services/openai/json_fields.h"

#include "absl/strings/str_cat.h"

namespace tandem::openai {

const Json* Field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError TypeError(const std::string& name, const char* want) {
  return InvalidRequest(name, absl::StrCat(name, ": must be ", want));
}

std::optional<bool> Bool(const Json& body, const char* name, std::optional<ApiError>* error) {
  const Json* v = Field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    *error = TypeError(name, "a boolean");
    return std::nullopt;
  }
  return v->get<bool>();
}

}  // namespace tandem::openai
