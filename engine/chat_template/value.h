// The values a chat template computes with, modelled on the Python objects Jinja2 hands a
// template: Undefined (Jinja2's default), None, bool, int, float, str (optionally Markup),
// list and tuple, dict (insertion-ordered), namespace(), callables (built-ins, bound
// methods, macros) and the `loop` object. Strings, lists and dicts are immutable and
// shared (copying a Value is a pointer copy), as the ImmutableSandboxedEnvironment that
// transformers uses forbids mutating them; a namespace is the one mutable object.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::chat_template_internal {

class Value;
class Dict;
class Runtime;
struct Namespace;
struct MacroStmt;
struct LoopState;
struct Callable;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kDict,
  kNamespace,
  kCallable,
  kLoop
};

class Value {
 public:
  Value() : rep_(UndefinedRep{}) {}
  // `hint` is the message of the error an operation on the value raises ("'x' is
  // undefined"); `unsafe` marks the sandbox's refusal of an attribute (a SecurityError).
  static Value Undefined(std::string hint, bool unsafe = false);
  static Value None() { return Value(NoneRep{}); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double f) { return Value(f); }
  static Value String(std::string s, bool markup = false);
  static Value SharedString(std::shared_ptr<const std::string> s, bool markup = false);
  static Value List(std::vector<Value> items, bool tuple = false);
  static Value SharedList(std::shared_ptr<const std::vector<Value>> items, bool tuple = false);
  static Value MakeDict(Dict d);
  static Value MakeNamespace(std::shared_ptr<Namespace> ns);
  static Value MakeCallable(Callable c);
  static Value MakeLoop(std::shared_ptr<LoopState> loop);

  Kind kind() const { return static_cast<Kind>(rep_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  // int or bool (Python's bool is an int) / int, float or bool.
  bool is_integral() const { return kind() == Kind::kInt || kind() == Kind::kBool; }
  bool is_number() const { return is_integral() || kind() == Kind::kFloat; }

  bool as_bool() const { return std::get<bool>(rep_); }
  int64_t as_int() const;   // int or bool
  double as_float() const;  // any number
  const std::string& str() const { return *std::get<StrRep>(rep_).s; }
  const std::shared_ptr<const std::string>& shared_str() const { return std::get<StrRep>(rep_).s; }
  bool markup() const { return std::get<StrRep>(rep_).markup; }
  const std::vector<Value>& list() const { return *std::get<ListRep>(rep_).items; }
  const std::shared_ptr<const std::vector<Value>>& shared_list() const { return std::get<ListRep>(rep_).items; }
  bool is_tuple() const { return std::get<ListRep>(rep_).tuple; }
  const Dict& dict() const { return *std::get<DictRep>(rep_).d; }
  Namespace& ns() const { return *std::get<NamespaceRep>(rep_).ns; }
  const Callable& callable() const { return *std::get<CallableRep>(rep_).fn; }
  LoopState& loop() const { return *std::get<LoopRep>(rep_).loop; }
  const std::string& undefined_hint() const { return *std::get<UndefinedRep>(rep_).hint; }
  bool undefined_unsafe() const { return std::get<UndefinedRep>(rep_).unsafe; }
  // The object's identity, for the `sameas` test (null for values without one).
  const void* identity() const;
  // Nesting depth of lists and dicts (0 for scalars), so the renderer can refuse values
  // deep enough to exhaust the stack when destroyed or printed.
  int depth() const;

 private:
  struct UndefinedRep {
    std::shared_ptr<const std::string> hint;
    bool unsafe = false;
  };
  struct NoneRep {};
  struct StrRep {
    std::shared_ptr<const std::string> s;
    bool markup = false;
  };
  struct ListRep {
    std::shared_ptr<const std::vector<Value>> items;
    bool tuple = false;
    int depth = 1;
  };
  struct DictRep {
    std::shared_ptr<const Dict> d;
    int depth = 1;
  };
  struct NamespaceRep {
    std::shared_ptr<Namespace> ns;
  };
  struct CallableRep {
    std::shared_ptr<const Callable> fn;
  };
  struct LoopRep {
    std::shared_ptr<LoopState> loop;
  };
  using Rep = std::variant<UndefinedRep, NoneRep, bool, int64_t, double, StrRep, ListRep, DictRep, NamespaceRep,
                           CallableRep, LoopRep>;
  template <typename T>
  explicit Value(T rep) : rep_(std::move(rep)) {}

  Rep rep_;
};

// A Python dict with str keys (JSON objects and template dict literals), insertion order.
class Dict {
 public:
  // Setting an existing key replaces its value in place (keeps its position).
  void Set(std::string key, Value v);
  const Value* Find(std::string_view key) const;
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // built past kLinearLimit entries
};

// Jinja2's namespace(): attributes assignable from any scope.
struct Namespace {
  Dict attrs;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using BuiltinFn = absl::StatusOr<Value> (*)(Runtime& rt, const Value& self, CallArgs& args);

struct Callable {
  std::string name;  // for messages
  BuiltinFn builtin = nullptr;
  std::shared_ptr<const Value> self;  // the receiver of a bound method
  const MacroStmt* macro = nullptr;   // a template macro (owned by the parsed template)
};

// The state behind `loop` in a for loop.
struct LoopState {
  std::shared_ptr<const std::vector<Value>> items;
  int64_t index0 = 0;
  int64_t depth0 = 0;
  std::optional<std::vector<Value>> last_changed;  // loop.changed()'s previous arguments
};

// Lists and dicts nested deeper than this are refused (RecursionError), so destroying,
// printing or comparing a value never exhausts the stack.
inline constexpr int kMaxValueDepth = 400;

// Whether `v` is, or holds at any depth, a value of kind `k` (a namespace stored in a
// namespace could form a reference cycle, which shared ownership would leak).
bool ContainsKind(const Value& v, Kind k);

// Python's type name of the value ("str", "dict", "NoneType", ...), for messages.
std::string TypeName(const Value& v);
// bool(v): false for Undefined, None, False, 0, 0.0 and empty str, list and dict.
bool Truthy(const Value& v);
// v1 == v2 as Python compares (1 == 1.0 == True; a tuple never equals a list; dicts by
// content; Undefined equals Undefined only).
bool PyEquals(const Value& a, const Value& b);
// -1, 0 or 1 as Python orders numbers, strings (by code point), lists and tuples.
// Errors: INVALID_ARGUMENT "'<' not supported between instances of ..." otherwise.
absl::StatusOr<int> PyCompare(const Value& a, const Value& b);
// str(v) / repr(v). str() of Undefined is "", of a float its repr.
std::string PyStr(const Value& v);
std::string PyRepr(const Value& v);

// JSON data as Python's json.loads would give it (objects keep their key order).
// Errors: INVALID_ARGUMENT for JSON nested more than 500 deep.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python writes it. indent:
// empty = None (one line), else the indentation string. Errors: INVALID_ARGUMENT "Object
// of type X is not JSON serializable".
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
absl::StatusOr<std::string> PyJsonDumps(const Value& v, const JsonDumpOptions& options);

}  // namespace tandem::chat_template_internal
