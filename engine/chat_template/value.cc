#include "engine/chat_template/value.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/py_text.h"

namespace tandem::chat_template_internal {
namespace {

constexpr size_t kLinearLimit = 8;
// Python raises RecursionError around 1000 frames; values nested deeper than this are
// printed as "..." and refused by comparisons and json.dumps, so no recursion here can
// exhaust the stack.
constexpr int kMaxNesting = 500;

bool EqualsAt(const Value& a, const Value& b, int depth);

bool ListEquals(const Value& a, const Value& b, int depth) {
  if (a.is_tuple() != b.is_tuple()) return false;
  const std::vector<Value>& x = a.list();
  const std::vector<Value>& y = b.list();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!EqualsAt(x[i], y[i], depth + 1)) return false;
  }
  return true;
}

bool DictEquals(const Dict& a, const Dict& b, int depth) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a.entries()) {
    const Value* other = b.Find(k);
    if (other == nullptr || !EqualsAt(v, *other, depth + 1)) return false;
  }
  return true;
}

bool EqualsAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList:
      return ListEquals(a, b, depth);
    case Kind::kDict:
      return DictEquals(a.dict(), b.dict(), depth);
    default:
      return a.identity() == b.identity();
  }
}

absl::StatusOr<int> CompareAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) return absl::InvalidArgumentError("RecursionError: values nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
    const double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const std::vector<Value>& x = a.list();
    const std::vector<Value>& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (EqualsAt(x[i], y[i], depth + 1)) continue;
      return CompareAt(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("TypeError: '<' not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
}

void AppendRepr(const Value& v, int depth, std::string* out);

void AppendDictRepr(const Dict& d, int depth, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) *out += ", ";
    first = false;
    *out += PyReprString(k);
    *out += ": ";
    AppendRepr(v, depth + 1, out);
  }
  out->push_back('}');
}

void AppendRepr(const Value& v, int depth, std::string* out) {
  if (depth > kMaxNesting) {
    *out += "...";
    return;
  }
  switch (v.kind()) {
    case Kind::kUndefined:
      *out += "Undefined";
      return;
    case Kind::kString:
      if (v.markup()) {
        absl::StrAppend(out, "Markup(", PyReprString(v.str()), ")");
      } else {
        *out += PyReprString(v.str());
      }
      return;
    case Kind::kList: {
      const std::vector<Value>& items = v.list();
      out->push_back(v.is_tuple() ? '(' : '[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += ", ";
        AppendRepr(items[i], depth + 1, out);
      }
      if (v.is_tuple() && items.size() == 1) out->push_back(',');
      out->push_back(v.is_tuple() ? ')' : ']');
      return;
    }
    case Kind::kDict:
      AppendDictRepr(v.dict(), depth, out);
      return;
    case Kind::kNamespace:
      *out += "<Namespace ";
      AppendDictRepr(v.ns().attrs, depth, out);
      *out += ">";
      return;
    case Kind::kCallable:
      if (v.callable().macro != nullptr) {
        absl::StrAppend(out, "<Macro ", PyReprString(v.callable().name), ">");
      } else {
        absl::StrAppend(out, "<built-in method ", v.callable().name, ">");
      }
      return;
    case Kind::kLoop: {
      const LoopState& l = v.loop();
      absl::StrAppend(out, "<LoopContext ", l.index0 + 1, "/", l.items->size(), ">");
      return;
    }
    default:
      *out += PyStr(v);
      return;
  }
}

struct JsonWriter {
  const JsonDumpOptions& options;
  std::string item_sep, key_sep;
  std::string out;

  void Newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *options.indent;
  }

  absl::Status Write(const Value& v, int level) {
    if (level > kMaxNesting) return absl::InvalidArgumentError("RecursionError: value nested too deeply for tojson");
    switch (v.kind()) {
      case Kind::kNone:
        out += "null";
        return absl::OkStatus();
      case Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return absl::OkStatus();
      case Kind::kInt:
        absl::StrAppend(&out, v.as_int());
        return absl::OkStatus();
      case Kind::kFloat: {
        const double f = v.as_float();
        if (std::isnan(f)) {
          out += "NaN";
        } else if (std::isinf(f)) {
          out += f > 0 ? "Infinity" : "-Infinity";
        } else {
          out += PyFloatRepr(f);
        }
        return absl::OkStatus();
      }
      case Kind::kString:
        AppendJsonString(v.str(), options.ensure_ascii, &out);
        return absl::OkStatus();
      case Kind::kList:
        return WriteList(v.list(), level);
      case Kind::kDict:
        return WriteDict(v.dict(), level);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("TypeError: Object of type ", TypeName(v), " is not JSON serializable"));
    }
  }

  absl::Status WriteList(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out += "[]";
      return absl::OkStatus();
    }
    out.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_sep;
      if (options.indent) Newline(level + 1);
      if (absl::Status s = Write(items[i], level + 1); !s.ok()) return s;
    }
    if (options.indent) Newline(level);
    out.push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const Dict& d, int level) {
    if (d.size() == 0) {
      out += "{}";
      return absl::OkStatus();
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& e : d.entries()) entries.push_back(&e);
    if (options.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
    }
    out.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out += item_sep;
      if (options.indent) Newline(level + 1);
      AppendJsonString(entries[i]->first, options.ensure_ascii, &out);
      out += key_sep;
      if (absl::Status s = Write(entries[i]->second, level + 1); !s.ok()) return s;
    }
    if (options.indent) Newline(level);
    out.push_back('}');
    return absl::OkStatus();
  }
};

absl::StatusOr<Value> FromJsonAt(const nlohmann::ordered_json& j, int depth) {
  if (depth >= kMaxValueDepth) return absl::InvalidArgumentError("JSON nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));  // Python would keep the exact integer
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        absl::StatusOr<Value> v = FromJsonAt(e, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) {
        absl::StatusOr<Value> v = FromJsonAt(e, depth + 1);
        if (!v.ok()) return v.status();
        d.Set(k, *std::move(v));
      }
      return Value::MakeDict(std::move(d));
    }
    default:
      return absl::InvalidArgumentError("unsupported JSON value (binary)");
  }
}

}  // namespace

void Dict::Set(std::string key, Value v) {
  if (Value* existing = const_cast<Value*>(Find(key))) {
    *existing = std::move(v);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(v));
  if (entries_.size() > kLinearLimit) {
    if (index_.empty()) {
      for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
    } else {
      index_.emplace(entries_.back().first, entries_.size() - 1);
    }
  }
}

const Value* Dict::Find(std::string_view key) const {
  if (!index_.empty()) {
    auto it = index_.find(absl::string_view(key.data(), key.size()));
    return it == index_.end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value Value::Undefined(std::string hint, bool unsafe) {
  return Value(UndefinedRep{std::make_shared<const std::string>(std::move(hint)), unsafe});
}
Value Value::String(std::string s, bool markup) {
  return Value(StrRep{std::make_shared<const std::string>(std::move(s)), markup});
}
Value Value::SharedString(std::shared_ptr<const std::string> s, bool markup) {
  return Value(StrRep{std::move(s), markup});
}
Value Value::List(std::vector<Value> items, bool tuple) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  return Value(ListRep{std::make_shared<const std::vector<Value>>(std::move(items)), tuple, depth + 1});
}
Value Value::SharedList(std::shared_ptr<const std::vector<Value>> items, bool tuple) {
  int depth = 0;
  for (const Value& v : *items) depth = std::max(depth, v.depth());
  return Value(ListRep{std::move(items), tuple, depth + 1});
}
Value Value::MakeDict(Dict d) {
  int depth = 0;
  for (const auto& [k, v] : d.entries()) depth = std::max(depth, v.depth());
  return Value(DictRep{std::make_shared<const Dict>(std::move(d)), depth + 1});
}

int Value::depth() const {
  if (kind() == Kind::kList) return std::get<ListRep>(rep_).depth;
  if (kind() == Kind::kDict) return std::get<DictRep>(rep_).depth;
  return 0;
}
Value Value::MakeNamespace(std::shared_ptr<Namespace> ns) { return Value(NamespaceRep{std::move(ns)}); }
Value Value::MakeCallable(Callable c) { return Value(CallableRep{std::make_shared<const Callable>(std::move(c))}); }
Value Value::MakeLoop(std::shared_ptr<LoopState> loop) { return Value(LoopRep{std::move(loop)}); }

int64_t Value::as_int() const {
  if (kind() == Kind::kBool) return as_bool() ? 1 : 0;
  return std::get<int64_t>(rep_);
}

double Value::as_float() const {
  if (kind() == Kind::kFloat) return std::get<double>(rep_);
  return static_cast<double>(as_int());
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::kString:
      return std::get<StrRep>(rep_).s.get();
    case Kind::kList:
      return std::get<ListRep>(rep_).items.get();
    case Kind::kDict:
      return std::get<DictRep>(rep_).d.get();
    case Kind::kNamespace:
      return std::get<NamespaceRep>(rep_).ns.get();
    case Kind::kCallable:
      return std::get<CallableRep>(rep_).fn.get();
    case Kind::kLoop:
      return std::get<LoopRep>(rep_).loop.get();
    default:
      return nullptr;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return v.callable().macro != nullptr ? "Macro" : "builtin_function_or_method";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_float() != 0.0;
    case Kind::kString:
      return !v.str().empty();
    case Kind::kList:
      return !v.list().empty();
    case Kind::kDict:
      return v.dict().size() > 0;
    default:
      return true;
  }
}

bool ContainsKind(const Value& v, Kind k) {
  if (v.kind() == k) return true;
  if (v.is_list()) {
    for (const Value& item : v.list()) {
      if (ContainsKind(item, k)) return true;
    }
  } else if (v.is_dict()) {
    for (const auto& [key, item] : v.dict().entries()) {
      if (ContainsKind(item, k)) return true;
    }
  }
  return false;
}

bool PyEquals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }
absl::StatusOr<int> PyCompare(const Value& a, const Value& b) { return CompareAt(a, b, 0); }

std::string PyStr(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(v.as_int());
    case Kind::kFloat:
      return PyFloatRepr(v.as_float());
    case Kind::kString:
      return v.str();
    default:
      return PyRepr(v);
  }
}

std::string PyRepr(const Value& v) {
  std::string out;
  AppendRepr(v, 0, &out);
  return out;
}

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 0); }

absl::StatusOr<std::string> PyJsonDumps(const Value& v, const JsonDumpOptions& options) {
  JsonWriter w{options, ", ", ": ", {}};
  if (options.indent) w.item_sep = ",";
  if (options.separators) {
    w.item_sep = options.separators->first;
    w.key_sep = options.separators->second;
  }
  if (absl::Status s = w.Write(v, 0); !s.ok()) return s;
  return std::move(w.out);
}

}  // namespace tandem::chat_template_internal
