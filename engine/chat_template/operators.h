// Python's operators on template values, and Jinja2's sandboxed attribute, item and
// slice access (environment.getattr tries the attribute, then the item; getitem the
// item, then the attribute; failures give Undefined, an Undefined operand raises).
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat_template/builtins.h"
#include "engine/chat_template/value.h"

namespace tandem::chat_template_internal {

// + - * / // % ** as Python evaluates them (int overflow is an error: Python's ints are
// unbounded, 64 bits here). Errors: INVALID_ARGUMENT "TypeError: ...",
// "ZeroDivisionError: ...", UndefinedError for an Undefined operand.
absl::StatusOr<Value> BinaryOp(Runtime& rt, std::string_view op, const Value& a, const Value& b);
absl::StatusOr<Value> Negate(const Value& a);
absl::StatusOr<Value> UnaryPlus(const Value& a);
// == != < <= > >= in notin.
absl::StatusOr<bool> CompareOp(std::string_view op, const Value& a, const Value& b);
// `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step]; an absent bound is nullopt.
absl::StatusOr<Value> Slice(Runtime& rt, const Value& obj, const std::optional<Value>& start,
                            const std::optional<Value>& stop, const std::optional<Value>& step);

}  // namespace tandem::chat_template_internal
