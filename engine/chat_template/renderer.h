// Runs a parsed template over a context with Jinja2's semantics: its scoping (a for
// loop's body gets a fresh scope each iteration, `if` none; namespace() attributes are
// shared), its Undefined, the sandbox's attribute rules, Python's operators. Every run
// is bounded: work steps, bytes allocated, output size and macro call depth.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat_template/ast.h"
#include "engine/chat_template/value.h"

namespace tandem::chat_template_internal {

struct RenderBudget {
  int64_t max_output_bytes;
  int64_t max_allocated_bytes;
  int64_t max_steps;
  int max_call_depth;
  std::function<int64_t()> now_micros;  // null: the system clock
};

// `context` must be a dict: its entries are the template's variables. `source` is the
// normalized template text (for error positions). Errors: INVALID_ARGUMENT "line L,
// column C: <Python exception>: <message>" for a runtime error or raise_exception;
// RESOURCE_EXHAUSTED when the budget runs out.
absl::StatusOr<std::string> RenderTemplate(std::string_view source, const Body& body, const Value& context,
                                           const RenderBudget& budget);

}  // namespace tandem::chat_template_internal
