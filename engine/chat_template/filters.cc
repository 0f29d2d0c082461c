// Jinja2 3.1's built-in filters (jinja2/filters.py), with transformers' tojson.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/chat_template/builtins.h"
#include "engine/chat_template/operators.h"
#include "engine/chat_template/py_text.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {
namespace {

using Args = std::vector<std::optional<Value>>;

// Jinja2's soft_str: strings as they are, anything else through str().
std::string SoftStr(const Value& v) { return v.is_string() ? v.str() : PyStr(v); }

Value LowerIfString(const Value& v) { return v.is_string() ? Value::String(PyLower(v.str())) : v; }

// make_attrgetter: "a.b.0" walks items (getitem, then attribute), digits as ints.
absl::StatusOr<Value> GetPath(Runtime& rt, const Value& item, const Value& attribute,
                              const std::optional<Value>& default_value) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    const std::string& a = attribute.str();
    size_t start = 0;
    while (true) {
      const size_t dot = a.find('.', start);
      const std::string part = a.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value::Int(std::strtoll(part.c_str(), nullptr, 10)) : Value::String(part));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else {
    parts.push_back(attribute);
  }
  Value cur = item;
  for (const Value& part : parts) {
    ASSIGN_OR_RETURN(cur, rt.GetItem(cur, part));
    if (default_value && !default_value->is_none() && cur.is_undefined()) cur = *default_value;
  }
  return cur;
}

// The sort key of make_multi_attrgetter / make_attrgetter with ignore_case.
absl::StatusOr<Value> SortKey(Runtime& rt, const Value& item, const std::optional<Value>& attribute,
                              bool case_sensitive) {
  if (!attribute || attribute->is_none()) return case_sensitive ? item : LowerIfString(item);
  if (!attribute->is_string() || attribute->str().find(',') == std::string::npos) {
    ASSIGN_OR_RETURN(Value v, GetPath(rt, item, *attribute, std::nullopt));
    return case_sensitive ? v : LowerIfString(v);
  }
  std::vector<Value> keys;
  const std::string& a = attribute->str();
  size_t start = 0;
  while (true) {
    const size_t comma = a.find(',', start);
    const Value part = Value::String(a.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    ASSIGN_OR_RETURN(Value v, GetPath(rt, item, part, std::nullopt));
    keys.push_back(case_sensitive ? v : LowerIfString(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Value::List(std::move(keys));
}

// Python's sorted(): stable; reverse keeps equal elements in order.
absl::StatusOr<std::vector<Value>> SortedBy(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error = absl::OkStatus();
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    absl::StatusOr<int> c = reverse ? PyCompare(keys[y], keys[x]) : PyCompare(keys[x], keys[y]);
    if (!c.ok()) {
      if (error.ok()) error = c.status();
      return false;
    }
    return *c < 0;
  });
  RETURN_IF_ERROR(error);
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

// ---- the filters ----

absl::StatusOr<Value> FAbs(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("abs", args, {}));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) return PyError("OverflowError", "integer result does not fit in 64 bits");
    return Value::Int(std::llabs(v.as_int()));
  }
  if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.as_float()));
  return PyError("TypeError", absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

absl::StatusOr<Value> FAttr(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("attr", args, {"name"}));
  if (!a[0]) return PyError("TypeError", "attr() missing required argument 'name'");
  const std::string name = SoftStr(*a[0]);
  if (v.is_dict()) {  // getattr only: a dict's keys are not attributes
    bool unsafe = false;
    if (std::optional<Value> m = FindMethod(v, name, &unsafe)) return *m;
    return Value::Undefined(absl::StrCat("'dict object' has no attribute '", name, "'"), unsafe);
  }
  return rt.GetAttr(v, name);
}

absl::StatusOr<Value> FBatch(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("batch", args, {"linecount", "fill_with"}));
  if (!a[0]) return PyError("TypeError", "batch() missing required argument 'linecount'");
  ASSIGN_OR_RETURN(int64_t n, IntArg("batch", "linecount", *a[0]));
  if (n < 1) return PyError("ValueError", "batch(): linecount must be at least 1");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  std::vector<Value> out, tmp;
  for (Value& item : items) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::List(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(std::move(item));
  }
  if (!tmp.empty()) {
    if (a[1] && !a[1]->is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(*a[1]);
    }
    out.push_back(Value::List(std::move(tmp)));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FCapitalize(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("capitalize", args, {}));
  return Value::String(PyCapitalize(SoftStr(v)));
}

absl::StatusOr<Value> FCenter(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("center", args, {"width"}));
  int64_t width = 80;
  if (a[0]) {
    ASSIGN_OR_RETURN(width, IntArg("center", "width", *a[0]));
  }
  const std::string s = SoftStr(v);
  const int64_t marg = width - static_cast<int64_t>(CodePointCount(s));
  if (marg <= 0) return Value::String(s);
  const int64_t left = marg / 2 + (marg & width & 1);
  return Value::String(std::string(left, ' ') + s + std::string(marg - left, ' '));
}

absl::StatusOr<Value> FDefault(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("default", args, {"default_value", "boolean"}));
  const bool boolean = a[1] && Truthy(*a[1]);
  if (v.is_undefined() || (boolean && !Truthy(v))) return a[0] ? *a[0] : Value::String("");
  return v;
}

absl::StatusOr<Value> FDictsort(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"}));
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_dict())
    return PyError("AttributeError", absl::StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  const bool case_sensitive = a[0] && Truthy(*a[0]);
  const std::string by = a[1] ? SoftStr(*a[1]) : "key";
  if (by != "key" && by != "value")
    return PyError("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.dict().entries()) {
    items.push_back(Value::List({Value::String(k), val}, true));
    const Value& key = by == "key" ? items.back().list()[0] : val;
    keys.push_back(case_sensitive ? key : LowerIfString(key));
  }
  RETURN_IF_ERROR(rt.Charge(items.size() * 3 * sizeof(Value)));
  ASSIGN_OR_RETURN(std::vector<Value> sorted, SortedBy(std::move(items), keys, a[2] && Truthy(*a[2])));
  return Value::List(std::move(sorted));
}

absl::StatusOr<Value> FEscape(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("escape", args, {}));
  if (v.is_string() && v.markup()) return v;
  return Value::String(HtmlEscape(PyStr(v)), true);
}

absl::StatusOr<Value> FForceEscape(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("forceescape", args, {}));
  return Value::String(HtmlEscape(PyStr(v)), true);
}

absl::StatusOr<Value> FFirst(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("first", args, {}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FLast(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("last", args, {}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float() of a string, or nullopt.
std::optional<double> ParsePyFloat(const std::string& s) {
  std::string t = PyStrip(s, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_') {
      const bool ok = i > 0 && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i - 1])) &&
                      std::isdigit(static_cast<unsigned char>(t[i + 1]));
      if (!ok) return std::nullopt;
      continue;
    }
    clean.push_back(t[i]);
  }
  if (clean.empty()) return std::nullopt;
  const std::string lower = PyLower(clean);
  const std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double x = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -x : x;
  }
  for (char c : body) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != '+' && c != '-')
      return std::nullopt;
  }
  char* end = nullptr;
  const double x = std::strtod(clean.c_str(), &end);
  if (end == nullptr || *end != 0) return std::nullopt;
  return x;
}

// Python's int(s, base) of a string, or nullopt.
std::optional<int64_t> ParsePyInt(const std::string& s, int base) {
  std::string t = PyStrip(s, std::nullopt, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) negative = t[i++] == '-';
  if (i + 1 < t.size() && t[i] == '0') {
    const char p = static_cast<char>(t[i + 1] | 0x20);
    const int prefixed = p == 'x' ? 16 : (p == 'o' ? 8 : (p == 'b' ? 2 : 0));
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      i += 2;
      if (i < t.size() && t[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || i >= t.size()) return std::nullopt;
  uint64_t value = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= t.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    if (value > (uint64_t{1} << 63) / static_cast<uint64_t>(base)) return std::nullopt;
    value = value * base + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  if (value > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

absl::StatusOr<Value> FFloat(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("float", args, {"default"}));
  const Value def = a[0] ? *a[0] : Value::Float(0.0);
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    if (std::optional<double> x = ParsePyFloat(v.str())) return Value::Float(*x);
  }
  return def;
}

absl::StatusOr<Value> FInt(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("int", args, {"default", "base"}));
  const Value def = a[0] ? *a[0] : Value::Int(0);
  int64_t base = 10;
  if (a[1]) {
    ASSIGN_OR_RETURN(base, IntArg("int", "base", *a[1]));
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value::Int(v.as_int());
  std::optional<double> f;
  if (v.kind() == Kind::kFloat) f = v.as_float();
  if (v.is_string()) {
    if (std::optional<int64_t> i = ParsePyInt(v.str(), static_cast<int>(base))) return Value::Int(*i);
    f = ParsePyFloat(v.str());  // "42.23"|int gives 42
  }
  if (!f || std::isnan(*f)) return def;
  if (std::isinf(*f)) return PyError("OverflowError", "cannot convert float infinity to integer");
  if (std::fabs(*f) >= 9.2e18) return PyError("OverflowError", "integer does not fit in 64 bits");
  return Value::Int(static_cast<int64_t>(*f));
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t at = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                     cp == 0x2028 || cp == 0x2029;
    if (!brk) continue;
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    lines.push_back(s.substr(start, at - start));
    start = pos;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

absl::StatusOr<Value> FIndent(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("indent", args, {"width", "first", "blank"}));
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string()) {
    return PyError("TypeError", absl::StrCat("unsupported operand type(s) for +=: '", TypeName(v), "' and 'str'"));
  }
  std::string indention(4, ' ');
  if (a[0]) {
    if (a[0]->is_string()) {
      indention = a[0]->str();
    } else {
      ASSIGN_OR_RETURN(int64_t w, IntArg("indent", "width", *a[0]));
      indention = std::string(std::max<int64_t>(w, 0), ' ');
    }
  }
  const bool first = a[1] && Truthy(*a[1]);
  const bool blank = a[2] && Truthy(*a[2]);
  std::vector<std::string> lines = SplitLines(v.str() + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  RETURN_IF_ERROR(rt.Charge(rv.size()));
  return Value::String(std::move(rv), v.markup());
}

absl::StatusOr<Value> FItems(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("items", args, {}));
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) return PyError("TypeError", "Can only get item pairs from a mapping.");
  RETURN_IF_ERROR(rt.Charge(v.dict().size() * 3 * sizeof(Value)));
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().entries()) out.push_back(Value::List({Value::String(k), val}, true));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FJoin(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("join", args, {"d", "attribute"}));
  const std::string sep = a[0] ? SoftStr(*a[0]) : "";
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (a[1] && !a[1]->is_none()) {
      ASSIGN_OR_RETURN(item, GetPath(rt, item, *a[1], std::nullopt));
    }
    const std::string piece = SoftStr(item);
    RETURN_IF_ERROR(rt.Charge(piece.size() + (i > 0 ? sep.size() : 0)));
    if (i > 0) out += sep;
    out += piece;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FLength(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("length", args, {}));
  ASSIGN_OR_RETURN(int64_t n, Length(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FList(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("list", args, {}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  RETURN_IF_ERROR(rt.Charge(items.size() * sizeof(Value)));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FLower(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("lower", args, {}));
  return Value::String(PyLower(SoftStr(v)));
}

absl::StatusOr<Value> FUpper(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("upper", args, {}));
  return Value::String(PyUpper(SoftStr(v)));
}

// Jinja2's own title (not str.title): split before runs of '-', whitespace, '(', '{',
// '[' or '<'; each piece gets its first character upper-cased and the rest lower-cased.
absl::StatusOr<Value> FTitle(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("title", args, {}));
  const std::string s = SoftStr(v);
  auto separator = [](uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || PyIsSpace(cp);
  };
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    // A piece: a run of separators, or a run of other characters.
    const size_t start = pos;
    size_t probe = pos;
    const bool sep = separator(NextCodePoint(s, &probe));
    size_t end = probe;
    while (end < s.size()) {
      size_t q = end;
      if (separator(NextCodePoint(s, &q)) != sep) break;
      end = q;
    }
    out += PyUpper(s.substr(start, probe - start));
    out += PyLower(s.substr(probe, end - probe));
    pos = end;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FMap(Runtime& rt, const Value& v, CallArgs& args) {
  // Jinja2's map, select and reject start with `if value:`: a falsy input maps to nothing.
  ASSIGN_OR_RETURN(std::vector<Value> items, Truthy(v) ? Iterate(rt, v) : std::vector<Value>());
  std::vector<Value> out;
  out.reserve(items.size());
  if (args.positional.empty()) {
    std::optional<Value> attribute, def;
    for (auto& [k, val] : args.keyword) {
      if (k == "attribute") {
        attribute = val;
      } else if (k == "default") {
        def = val;
      } else {
        return PyError("FilterArgumentError", absl::StrCat("Unexpected keyword argument '", k, "'"));
      }
    }
    if (!attribute) return PyError("FilterArgumentError", "map requires a filter argument");
    for (const Value& item : items) {
      RETURN_IF_ERROR(rt.Step());
      ASSIGN_OR_RETURN(Value x, GetPath(rt, item, *attribute, def));
      out.push_back(std::move(x));
    }
  } else {
    if (!args.positional[0].is_string()) return PyError("FilterArgumentError", "map requires a filter name");
    const std::string name = args.positional[0].str();
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, rt.ApplyFilter(name, item, rest));
      out.push_back(std::move(x));
    }
  }
  RETURN_IF_ERROR(rt.Charge(out.size() * sizeof(Value)));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MinMax(Runtime& rt, const Value& v, CallArgs& args, bool want_max) {
  ASSIGN_OR_RETURN(Args a, BindArgs(want_max ? "max" : "min", args, {"case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const bool case_sensitive = a[0] && Truthy(*a[0]);
  size_t best = 0;
  ASSIGN_OR_RETURN(Value best_key, SortKey(rt, items[0], a[1], case_sensitive));
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value key, SortKey(rt, items[i], a[1], case_sensitive));
    ASSIGN_OR_RETURN(int c, PyCompare(key, best_key));
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}
absl::StatusOr<Value> FMax(Runtime& rt, const Value& v, CallArgs& args) { return MinMax(rt, v, args, true); }
absl::StatusOr<Value> FMin(Runtime& rt, const Value& v, CallArgs& args) { return MinMax(rt, v, args, false); }

absl::StatusOr<Value> SelectOrReject(Runtime& rt, const Value& v, CallArgs& args, bool select, bool by_attribute) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Truthy(v) ? Iterate(rt, v) : std::vector<Value>());
  size_t off = 0;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (args.positional.empty()) return PyError("FilterArgumentError", "Missing parameter for attribute name");
    attribute = args.positional[0];
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (args.positional.size() > off) {
    if (!args.positional[off].is_string()) return PyError("FilterArgumentError", "the test name must be a string");
    test = args.positional[off].str();
    test_args.positional.assign(args.positional.begin() + off + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    RETURN_IF_ERROR(rt.Step());
    Value x = item;
    if (attribute) {
      ASSIGN_OR_RETURN(x, GetPath(rt, item, *attribute, std::nullopt));
    }
    bool keep;
    if (test) {
      ASSIGN_OR_RETURN(keep, rt.ApplyTest(*test, x, test_args));
    } else {
      keep = Truthy(x);
    }
    if (keep == select) out.push_back(item);
  }
  RETURN_IF_ERROR(rt.Charge(out.size() * sizeof(Value)));
  return Value::List(std::move(out));
}
absl::StatusOr<Value> FSelect(Runtime& rt, const Value& v, CallArgs& args) {
  return SelectOrReject(rt, v, args, true, false);
}
absl::StatusOr<Value> FReject(Runtime& rt, const Value& v, CallArgs& args) {
  return SelectOrReject(rt, v, args, false, false);
}
absl::StatusOr<Value> FSelectAttr(Runtime& rt, const Value& v, CallArgs& args) {
  return SelectOrReject(rt, v, args, true, true);
}
absl::StatusOr<Value> FRejectAttr(Runtime& rt, const Value& v, CallArgs& args) {
  return SelectOrReject(rt, v, args, false, true);
}

absl::StatusOr<Value> FReplace(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("replace", args, {"old", "new", "count"}));
  if (!a[0] || !a[1]) return PyError("TypeError", "replace() missing required arguments 'old' and 'new'");
  int64_t count = -1;
  if (a[2] && !a[2]->is_none()) {
    ASSIGN_OR_RETURN(count, IntArg("replace", "count", *a[2]));
  }
  ASSIGN_OR_RETURN(std::string out, PyReplace(rt, SoftStr(v), SoftStr(*a[0]), SoftStr(*a[1]), count));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FReverse(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("reverse", args, {}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  std::reverse(items.begin(), items.end());
  if (v.is_string()) {
    std::string out;
    for (const Value& c : items) out += c.str();
    return Value::String(std::move(out));
  }
  RETURN_IF_ERROR(rt.Charge(items.size() * sizeof(Value)));
  return Value::List(std::move(items));
}

// Python's round(x, ndigits) on a float: correctly rounded, halves to even.
double RoundFloat(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0) {
    if (ndigits > 300) return x;
    char buf[512];
    const std::to_chars_result r =
        std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::fixed, static_cast<int>(ndigits));
    if (r.ec != std::errc()) return x;
    return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / scale) * scale;
}

absl::StatusOr<Value> FRound(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("round", args, {"precision", "method"}));
  int64_t precision = 0;
  if (a[0]) {
    ASSIGN_OR_RETURN(precision, IntArg("round", "precision", *a[0]));
  }
  const std::string method = a[1] ? SoftStr(*a[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return PyError("FilterArgumentError", "method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    if (v.is_undefined()) return UndefinedError(v);
    return PyError("TypeError", absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  }
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value::Int(v.as_int());
      const double r = RoundFloat(static_cast<double>(v.as_int()), precision);
      return Value::Int(static_cast<int64_t>(r));
    }
    return Value::Float(RoundFloat(v.as_float(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

absl::StatusOr<Value> FSafe(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("safe", args, {}));
  return Value::String(SoftStr(v), true);
}

absl::StatusOr<Value> FSort(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  const bool case_sensitive = a[1] && Truthy(*a[1]);
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    RETURN_IF_ERROR(rt.Step());
    ASSIGN_OR_RETURN(Value key, SortKey(rt, item, a[2], case_sensitive));
    keys.push_back(std::move(key));
  }
  RETURN_IF_ERROR(rt.Charge(items.size() * 2 * sizeof(Value)));
  ASSIGN_OR_RETURN(std::vector<Value> sorted, SortedBy(std::move(items), keys, a[0] && Truthy(*a[0])));
  return Value::List(std::move(sorted));
}

absl::StatusOr<Value> FString(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("string", args, {}));
  if (v.is_string()) return v;
  return Value::String(PyStr(v));
}

absl::StatusOr<Value> FSum(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("sum", args, {"attribute", "start"}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  Value total = a[1] ? *a[1] : Value::Int(0);
  if (total.is_string()) return PyError("TypeError", "sum() can't sum strings [use ''.join(seq) instead]");
  for (const Value& item : items) {
    RETURN_IF_ERROR(rt.Step());
    Value x = item;
    if (a[0] && !a[0]->is_none()) {
      ASSIGN_OR_RETURN(x, GetPath(rt, item, *a[0], std::nullopt));
    }
    ASSIGN_OR_RETURN(total, BinaryOp(rt, "+", total, x));
  }
  return total;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), not Jinja2's HTML-safe one.
absl::StatusOr<Value> FToJson(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions o;
  o.ensure_ascii = a[0] && Truthy(*a[0]);
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string()) {
      o.indent = a[1]->str();
    } else if (a[1]->is_integral()) {
      o.indent = std::string(std::max<int64_t>(a[1]->as_int(), 0), ' ');
    } else {
      return PyError("TypeError", "tojson(): indent must be an int or a str");
    }
  }
  if (a[2] && !a[2]->is_none()) {
    const Value& s = *a[2];
    if (!s.is_list() || s.list().size() != 2 || !s.list()[0].is_string() || !s.list()[1].is_string()) {
      return PyError("ValueError", "tojson(): separators must be a pair of strings");
    }
    o.separators = std::make_pair(s.list()[0].str(), s.list()[1].str());
  }
  o.sort_keys = a[3] && Truthy(*a[3]);
  ASSIGN_OR_RETURN(std::string out, PyJsonDumps(v, o));
  RETURN_IF_ERROR(rt.Charge(out.size()));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FTrim(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("trim", args, {"chars"}));
  std::optional<std::string> chars;
  if (a[0] && !a[0]->is_none()) chars = SoftStr(*a[0]);
  return Value::String(PyStrip(SoftStr(v), chars, true, true));
}

absl::StatusOr<Value> FTruncate(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("truncate", args, {"length", "killwords", "end", "leeway"}));
  int64_t length = 255, leeway = 5;
  if (a[0]) {
    ASSIGN_OR_RETURN(length, IntArg("truncate", "length", *a[0]));
  }
  if (a[3] && !a[3]->is_none()) {
    ASSIGN_OR_RETURN(leeway, IntArg("truncate", "leeway", *a[3]));
  }
  const std::string end = a[2] ? SoftStr(*a[2]) : "...";
  const int64_t end_len = static_cast<int64_t>(CodePointCount(end));
  if (length < end_len)
    return PyError("AssertionError", absl::StrCat("expected length >= ", end_len, ", got ", length));
  if (leeway < 0) return PyError("AssertionError", absl::StrCat("expected leeway >= 0, got ", leeway));
  // Jinja2 takes len() of the input as it is: anything short enough comes back unchanged.
  ASSIGN_OR_RETURN(int64_t n, Length(v));
  if (n <= length + leeway) return v;
  if (!v.is_string()) {
    return PyError("AttributeError", absl::StrCat("'", TypeName(v), "' object has no attribute 'rsplit'"));
  }
  const std::string& s = v.str();
  const std::vector<size_t> offsets = CodePointOffsets(s);
  std::string head = s.substr(0, offsets[length - end_len]);
  if (!(a[1] && Truthy(*a[1]))) {
    const size_t space = head.rfind(' ');
    if (space != std::string::npos) head.resize(space);
  }
  return Value::String(head + end);
}

// The type Python refuses to hash in `v` (dicts, lists, tuples holding them), or null.
const char* UnhashableType(const Value& v) {
  if (v.is_dict()) return "dict";
  if (v.is_list() && !v.is_tuple()) return "list";
  if (v.is_list()) {
    for (const Value& item : v.list()) {
      if (const char* t = UnhashableType(item)) return t;
    }
  }
  return nullptr;
}

absl::StatusOr<Value> FUnique(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("unique", args, {"case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, v));
  const bool case_sensitive = a[0] && Truthy(*a[0]);
  absl::flat_hash_set<std::string> seen_strings;
  std::vector<Value> seen_other, out;
  for (const Value& item : items) {
    RETURN_IF_ERROR(rt.Step());
    ASSIGN_OR_RETURN(Value key, SortKey(rt, item, a[1], case_sensitive));
    if (const char* type = UnhashableType(key)) {
      return PyError("TypeError", absl::StrCat("unhashable type: '", type, "'"));
    }
    bool fresh;
    if (key.is_string()) {
      fresh = seen_strings.insert(key.str()).second;
    } else {
      fresh = std::none_of(seen_other.begin(), seen_other.end(), [&](const Value& s) { return PyEquals(s, key); });
      if (fresh) seen_other.push_back(key);
    }
    if (fresh) out.push_back(item);
  }
  RETURN_IF_ERROR(rt.Charge(out.size() * sizeof(Value)));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FWordcount(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("wordcount", args, {}));
  const std::string s = SoftStr(v);
  int64_t words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    const bool word = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' ||
                      (cp >= 0x80 && !PyIsSpace(cp));
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::Int(words);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;  // null: Jinja2 has it, this interpreter does not
};

constexpr FilterEntry kFilters[] = {
    {"abs", FAbs},
    {"attr", FAttr},
    {"batch", FBatch},
    {"capitalize", FCapitalize},
    {"center", FCenter},
    {"count", FLength},
    {"d", FDefault},
    {"default", FDefault},
    {"dictsort", FDictsort},
    {"e", FEscape},
    {"escape", FEscape},
    {"filesizeformat", nullptr},
    {"first", FFirst},
    {"float", FFloat},
    {"forceescape", FForceEscape},
    {"format", nullptr},
    {"groupby", nullptr},
    {"indent", FIndent},
    {"int", FInt},
    {"items", FItems},
    {"join", FJoin},
    {"last", FLast},
    {"length", FLength},
    {"list", FList},
    {"lower", FLower},
    {"map", FMap},
    {"max", FMax},
    {"min", FMin},
    {"pprint", nullptr},
    {"random", nullptr},
    {"reject", FReject},
    {"rejectattr", FRejectAttr},
    {"replace", FReplace},
    {"reverse", FReverse},
    {"round", FRound},
    {"safe", FSafe},
    {"select", FSelect},
    {"selectattr", FSelectAttr},
    {"slice", nullptr},
    {"sort", FSort},
    {"string", FString},
    {"striptags", nullptr},
    {"sum", FSum},
    {"title", FTitle},
    {"tojson", FToJson},
    {"trim", FTrim},
    {"truncate", FTruncate},
    {"unique", FUnique},
    {"upper", FUpper},
    {"urlencode", nullptr},
    {"urlize", nullptr},
    {"wordcount", FWordcount},
    {"wordwrap", nullptr},
    {"xmlattr", nullptr},
};

const FilterEntry* Entry(std::string_view name) {
  for (const FilterEntry& f : kFilters) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  const FilterEntry* e = Entry(name);
  return e == nullptr ? nullptr : e->fn;
}

bool IsKnownFilter(std::string_view name) { return Entry(name) != nullptr; }

}  // namespace tandem::chat_template_internal
