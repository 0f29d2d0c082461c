#include "engine/runtime/output_constraint.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::string_view KindName(OutputConstraint::Kind kind) {
  switch (kind) {
    case OutputConstraint::Kind::kNone: return "none";
    case OutputConstraint::Kind::kJsonSchema: return "json_schema";
    case OutputConstraint::Kind::kJsonObject: return "json_object";
    case OutputConstraint::Kind::kRegex: return "regex";
    case OutputConstraint::Kind::kEbnf: return "ebnf";
  }
  return "unknown";
}

absl::Status Validate(const OutputConstraint& c) {
  if (!c.active()) return absl::OkStatus();
  const std::string field = absl::StrCat("constraint.", KindName(c.kind));
  if (c.kind == OutputConstraint::Kind::kJsonObject) {
    if (!c.text.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": takes no text"));
    return absl::OkStatus();
  }
  if (c.text.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (!c.json_rules.empty() && c.kind != OutputConstraint::Kind::kEbnf) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": json rules only go with ebnf"));
  }
  size_t bytes = c.text.size();
  for (size_t i = 0; i < c.json_rules.size(); ++i) {
    const grammar::JsonSchemaRule& r = c.json_rules[i];
    if (r.name.empty() || r.schema.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("constraint.ebnf.json_rules[", i, "]: needs a name and a schema"));
    }
    bytes += r.name.size() + r.schema.size();
  }
  if (bytes > kMaxConstraintBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", bytes, " bytes exceed the limit of ", kMaxConstraintBytes));
  }
  if (c.kind == OutputConstraint::Kind::kEbnf && c.root.empty()) {
    return absl::InvalidArgumentError("constraint.ebnf.root: must not be empty");
  }
  return absl::OkStatus();
}

void MaskLogits(std::span<float> logits, std::span<const uint32_t> bitmask) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t covered = std::min(logits.size(), bitmask.size() * 32);
  for (size_t w = 0; w * 32 < covered; ++w) {
    const uint32_t bits = bitmask[w];
    if (bits == ~uint32_t{0}) continue;
    const size_t end = std::min(covered, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i) {
      if (((bits >> (i % 32)) & 1u) == 0) logits[i] = kNegInf;
    }
  }
  for (size_t i = covered; i < logits.size(); ++i) logits[i] = kNegInf;
}

}  // namespace tandem
