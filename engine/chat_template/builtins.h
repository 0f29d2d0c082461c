// The built-in filters, tests, globals and methods of str, dict and list that templates
// call, as Jinja2 3.1 defines them with transformers' environment (its tojson,
// raise_exception and strftime_now; the sandbox's refusal of mutating methods). They
// reach the renderer through Runtime.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat_template/value.h"

namespace tandem::chat_template_internal {

// What a filter, test, method or global may ask of the renderer that runs it.
class Runtime {
 public:
  virtual ~Runtime() = default;
  // Attribute and item access with the sandbox's rules (environment.getattr/getitem).
  virtual absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) = 0;
  virtual absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) = 0;
  virtual absl::StatusOr<Value> Call(const Value& callee, CallArgs args) = 0;
  virtual absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, CallArgs args) = 0;
  virtual absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, CallArgs args) = 0;
  // Counts `bytes` of newly built strings or lists against the render's allocation
  // budget. Errors: RESOURCE_EXHAUSTED past it.
  virtual absl::Status Charge(size_t bytes) = 0;
  // Counts one unit of work against the step budget. Errors: RESOURCE_EXHAUSTED.
  virtual absl::Status Step() = 0;
  // Microseconds since the Unix epoch (strftime_now).
  virtual int64_t NowMicros() = 0;
};

using FilterFn = absl::StatusOr<Value> (*)(Runtime& rt, const Value& input, CallArgs& args);
using TestFn = absl::StatusOr<bool> (*)(Runtime& rt, const Value& input, CallArgs& args);

// The implementation of a filter or test; null for names Jinja2 knows but this
// interpreter does not implement (an error if the template runs them).
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);
// Whether Jinja2 (with transformers' additions) defines the name at all: Jinja2 refuses
// a template naming an unknown filter or test when it compiles it.
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// A global function (range, namespace, dict, raise_exception, strftime_now, cycler,
// joiner), or nullopt.
std::optional<Value> FindGlobal(std::string_view name);

// The bound method `name` of a str, dict or list, nullopt when the type has no such
// method. *unsafe is set for methods the immutable sandbox refuses (list.append,
// dict.update, ...): Jinja2 gives an Undefined whose use raises a SecurityError.
std::optional<Value> FindMethod(const Value& obj, std::string_view name, bool* unsafe);

// ---- helpers shared by the renderer and the built-ins ----

// iter(v) as a list: list and tuple items, dict keys, a string's code points; Undefined
// iterates as empty. The elements built (a string's characters, a dict's keys) are
// charged to rt. Errors: INVALID_ARGUMENT "'int' object is not iterable";
// RESOURCE_EXHAUSTED.
absl::StatusOr<std::vector<Value>> Iterate(Runtime& rt, const Value& v);
// len(v). Undefined has length 0. Errors: INVALID_ARGUMENT for types without len().
absl::StatusOr<int64_t> Length(const Value& v);
// The error an operation on an Undefined raises (UndefinedError, or SecurityError for
// the sandbox's refusals).
absl::Status UndefinedError(const Value& undefined);
// markupsafe.escape of text.
std::string HtmlEscape(std::string_view s);

// Python-style argument binding: the value given for each of `names` in order, from
// positional then keyword arguments. Errors: INVALID_ARGUMENT for too many positional
// arguments, an unknown keyword or one given twice.
absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(std::string_view function, CallArgs& args,
                                                           const std::vector<std::string_view>& names);
absl::StatusOr<int64_t> IntArg(std::string_view function, std::string_view param, const Value& v);
absl::StatusOr<std::string> StrArg(std::string_view function, std::string_view param, const Value& v);

// str.replace (count < 0: all), str.title and str.capitalize (ASCII letters only).
absl::StatusOr<std::string> PyReplace(Runtime& rt, const std::string& s, const std::string& old,
                                      const std::string& repl, int64_t count);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);

// An error as Python would report it: "TypeError: ...".
absl::Status PyError(std::string_view type, std::string_view message);

}  // namespace tandem::chat_template_internal
