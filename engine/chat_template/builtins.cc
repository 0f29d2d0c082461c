// Helpers the built-ins share, Jinja2's tests, and the template globals.
#include "engine/chat_template/builtins.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/operators.h"
#include "engine/chat_template/py_text.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {

// ---- helpers ----

absl::Status PyError(std::string_view type, std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(type), ": ", std::string(message)));
}

absl::Status UndefinedError(const Value& undefined) {
  return PyError(undefined.undefined_unsafe() ? "SecurityError" : "UndefinedError",
                 undefined.undefined_hint().empty() ? "value is undefined" : undefined.undefined_hint());
}

absl::StatusOr<std::vector<Value>> Iterate(Runtime& rt, const Value& v) {
  // A Value and its string's heap block, roughly.
  constexpr size_t kElementCost = 64;
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::vector<Value>();
    case Kind::kList:
      return v.list();
    case Kind::kDict: {
      RETURN_IF_ERROR(rt.Charge(v.dict().size() * kElementCost));
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& [k, _] : v.dict().entries()) keys.push_back(Value::String(k));
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      RETURN_IF_ERROR(rt.Charge(s.size() * kElementCost));
      for (size_t pos = 0; pos < s.size();) {
        const size_t start = pos;
        NextCodePoint(s, &pos);
        chars.push_back(Value::String(s.substr(start, pos - start)));
      }
      return chars;
    }
    case Kind::kLoop:
      return *v.loop().items;
    default:
      return PyError("TypeError", absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.str()));
    case Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    case Kind::kLoop:
      return static_cast<int64_t>(v.loop().items->size());
    default:
      return PyError("TypeError", absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(std::string_view function, CallArgs& args,
                                                           const std::vector<std::string_view>& names) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size()) {
    return PyError("TypeError", absl::StrCat(std::string(function), "() takes at most ", names.size(), " arguments (",
                                             args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = std::move(args.positional[i]);
  for (auto& [key, v] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      return PyError("TypeError",
                     absl::StrCat(std::string(function), "() got an unexpected keyword argument '", key, "'"));
    }
    if (out[i]) {
      return PyError("TypeError",
                     absl::StrCat(std::string(function), "() got multiple values for argument '", key, "'"));
    }
    out[i] = std::move(v);
  }
  return out;
}

absl::StatusOr<int64_t> IntArg(std::string_view function, std::string_view param, const Value& v) {
  if (v.is_integral()) return v.as_int();
  return PyError("TypeError", absl::StrCat(std::string(function), "(): '", std::string(param),
                                           "' must be an integer, not '", TypeName(v), "'"));
}

absl::StatusOr<std::string> StrArg(std::string_view function, std::string_view param, const Value& v) {
  if (v.is_string()) return v.str();
  return PyError("TypeError", absl::StrCat(std::string(function), "(): '", std::string(param),
                                           "' must be a string, not '", TypeName(v), "'"));
}

namespace {

// ---- tests ----

absl::StatusOr<Value> OneArg(std::string_view test, CallArgs& args) {
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    return PyError("TypeError", absl::StrCat("the test '", std::string(test), "' takes one argument"));
  }
  return args.positional[0];
}

absl::StatusOr<bool> CompareTest(std::string_view test, std::string_view op, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Value other, OneArg(test, args));
  return CompareOp(op, v, other);
}

// Jinja2's odd and even: value % 2 == 1 and value % 2 == 0 (so 2.5 is neither).
absl::StatusOr<bool> ParityTest(Runtime& rt, const Value& v, bool want_odd) {
  ASSIGN_OR_RETURN(Value m, BinaryOp(rt, "%", v, Value::Int(2)));
  return PyEquals(m, Value::Int(want_odd ? 1 : 0));
}

bool IsCasedLowerOrUpper(std::string_view s, bool lower) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    if (lower ? IsUpperLetter(cp) : IsLowerLetter(cp)) return false;
    if (IsCasedLetter(cp)) cased = true;
  }
  return cased;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

absl::StatusOr<bool> TestDefined(Runtime&, const Value& v, CallArgs&) { return !v.is_undefined(); }
absl::StatusOr<bool> TestUndefined(Runtime&, const Value& v, CallArgs&) { return v.is_undefined(); }
absl::StatusOr<bool> TestNone(Runtime&, const Value& v, CallArgs&) { return v.is_none(); }
absl::StatusOr<bool> TestBoolean(Runtime&, const Value& v, CallArgs&) { return v.kind() == Kind::kBool; }
absl::StatusOr<bool> TestTrue(Runtime&, const Value& v, CallArgs&) { return v.kind() == Kind::kBool && v.as_bool(); }
absl::StatusOr<bool> TestFalse(Runtime&, const Value& v, CallArgs&) { return v.kind() == Kind::kBool && !v.as_bool(); }
absl::StatusOr<bool> TestInteger(Runtime&, const Value& v, CallArgs&) { return v.kind() == Kind::kInt; }
absl::StatusOr<bool> TestFloat(Runtime&, const Value& v, CallArgs&) { return v.kind() == Kind::kFloat; }
absl::StatusOr<bool> TestNumber(Runtime&, const Value& v, CallArgs&) { return v.is_number(); }
absl::StatusOr<bool> TestString(Runtime&, const Value& v, CallArgs&) { return v.is_string(); }
absl::StatusOr<bool> TestMapping(Runtime&, const Value& v, CallArgs&) { return v.is_dict(); }
absl::StatusOr<bool> TestIterable(Runtime&, const Value& v, CallArgs&) {
  // Undefined and the loop object define __iter__.
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() || v.kind() == Kind::kLoop;
}
absl::StatusOr<bool> TestSequence(Runtime&, const Value& v, CallArgs&) {
  // len() and __getitem__: str, list, tuple, dict, and Undefined (it defines both).
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
absl::StatusOr<bool> TestCallable(Runtime&, const Value& v, CallArgs&) {
  return v.kind() == Kind::kCallable || v.is_undefined() || v.kind() == Kind::kLoop;
}
absl::StatusOr<bool> TestEscaped(Runtime&, const Value& v, CallArgs&) { return v.is_string() && v.markup(); }
absl::StatusOr<bool> TestEven(Runtime& rt, const Value& v, CallArgs&) { return ParityTest(rt, v, false); }
absl::StatusOr<bool> TestOdd(Runtime& rt, const Value& v, CallArgs&) { return ParityTest(rt, v, true); }
absl::StatusOr<bool> TestDivisibleBy(Runtime& rt, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Value n, OneArg("divisibleby", args));
  ASSIGN_OR_RETURN(Value m, BinaryOp(rt, "%", v, n));
  return PyEquals(m, Value::Int(0));
}
absl::StatusOr<bool> TestLower(Runtime&, const Value& v, CallArgs&) { return IsCasedLowerOrUpper(PyStr(v), true); }
absl::StatusOr<bool> TestUpper(Runtime&, const Value& v, CallArgs&) { return IsCasedLowerOrUpper(PyStr(v), false); }
absl::StatusOr<bool> TestSameAs(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Value other, OneArg("sameas", args));
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
      return v.as_int() == other.as_int();
    case Kind::kFloat:
      return false;
    default:
      return v.identity() == other.identity();
  }
}
absl::StatusOr<bool> TestIn(Runtime&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(Value seq, OneArg("in", args));
  return Contains(seq, v);
}
absl::StatusOr<bool> TestEq(Runtime&, const Value& v, CallArgs& args) { return CompareTest("eq", "==", v, args); }
absl::StatusOr<bool> TestNe(Runtime&, const Value& v, CallArgs& args) { return CompareTest("ne", "!=", v, args); }
absl::StatusOr<bool> TestLt(Runtime&, const Value& v, CallArgs& args) { return CompareTest("lt", "<", v, args); }
absl::StatusOr<bool> TestLe(Runtime&, const Value& v, CallArgs& args) { return CompareTest("le", "<=", v, args); }
absl::StatusOr<bool> TestGt(Runtime&, const Value& v, CallArgs& args) { return CompareTest("gt", ">", v, args); }
absl::StatusOr<bool> TestGe(Runtime&, const Value& v, CallArgs& args) { return CompareTest("ge", ">=", v, args); }
absl::StatusOr<bool> TestFilter(Runtime&, const Value& v, CallArgs&) { return v.is_string() && IsKnownFilter(v.str()); }
absl::StatusOr<bool> TestTest(Runtime&, const Value& v, CallArgs&) { return v.is_string() && IsKnownTest(v.str()); }

constexpr TestEntry kTests[] = {
    {"boolean", TestBoolean},
    {"callable", TestCallable},
    {"defined", TestDefined},
    {"divisibleby", TestDivisibleBy},
    {"eq", TestEq},
    {"equalto", TestEq},
    {"==", TestEq},
    {"escaped", TestEscaped},
    {"even", TestEven},
    {"false", TestFalse},
    {"filter", TestFilter},
    {"float", TestFloat},
    {"ge", TestGe},
    {">=", TestGe},
    {"gt", TestGt},
    {">", TestGt},
    {"greaterthan", TestGt},
    {"in", TestIn},
    {"integer", TestInteger},
    {"iterable", TestIterable},
    {"le", TestLe},
    {"<=", TestLe},
    {"lower", TestLower},
    {"lt", TestLt},
    {"<", TestLt},
    {"lessthan", TestLt},
    {"mapping", TestMapping},
    {"ne", TestNe},
    {"!=", TestNe},
    {"none", TestNone},
    {"number", TestNumber},
    {"odd", TestOdd},
    {"sameas", TestSameAs},
    {"sequence", TestSequence},
    {"string", TestString},
    {"test", TestTest},
    {"true", TestTrue},
    {"undefined", TestUndefined},
    {"upper", TestUpper},
};

// ---- globals ----

absl::StatusOr<Value> GlobalRange(Runtime& rt, const Value&, CallArgs& args) {
  if (!args.keyword.empty()) return PyError("TypeError", "range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) {
    return PyError("TypeError", "range expected 1 to 3 arguments");
  }
  int64_t start = 0, stop = 0, step = 1;
  std::vector<int64_t> v;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    ASSIGN_OR_RETURN(int64_t x, IntArg("range", "argument", args.positional[i]));
    v.push_back(x);
  }
  if (v.size() == 1) {
    stop = v[0];
  } else {
    start = v[0];
    stop = v[1];
    if (v.size() == 3) step = v[2];
  }
  if (step == 0) return PyError("ValueError", "range() arg 3 must not be zero");
  int64_t n = 0;
  if (step > 0 && start < stop) n = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) n = (start - stop - step - 1) / -step;
  constexpr int64_t kMaxRange = 100000;  // the sandbox's MAX_RANGE
  if (n > kMaxRange) {
    return PyError("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  RETURN_IF_ERROR(rt.Charge(static_cast<size_t>(n) * sizeof(Value)));
  std::vector<Value> items;
  items.reserve(n);
  for (int64_t i = 0; i < n; ++i) items.push_back(Value::Int(start + i * step));
  return Value::List(std::move(items));
}

absl::StatusOr<Dict> DictFromArgs(std::string_view function, CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) {
    return PyError("TypeError", absl::StrCat(std::string(function), " expected at most 1 positional argument"));
  }
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict().entries()) d.Set(k, v);
    } else if (src.is_list()) {
      for (const Value& pair : src.list()) {
        if (!pair.is_list() || pair.list().size() != 2 || !pair.list()[0].is_string()) {
          return PyError("TypeError", absl::StrCat(std::string(function), ": expected (str, value) pairs"));
        }
        d.Set(pair.list()[0].str(), pair.list()[1]);
      }
    } else {
      return PyError("TypeError", absl::StrCat("'", TypeName(src), "' object is not iterable"));
    }
  }
  for (auto& [k, v] : args.keyword) d.Set(k, std::move(v));
  return d;
}

absl::StatusOr<Value> GlobalDict(Runtime&, const Value&, CallArgs& args) {
  ASSIGN_OR_RETURN(Dict d, DictFromArgs("dict", args));
  return Value::MakeDict(std::move(d));
}

absl::StatusOr<Value> GlobalNamespace(Runtime&, const Value&, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  ASSIGN_OR_RETURN(ns->attrs, DictFromArgs("namespace", args));
  return Value::MakeNamespace(std::move(ns));
}

absl::StatusOr<Value> GlobalRaiseException(Runtime&, const Value&, CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<std::optional<Value>> a, BindArgs("raise_exception", args, {"message"}));
  return PyError("TemplateError", a[0] ? PyStr(*a[0]) : std::string());
}

absl::StatusOr<Value> GlobalStrftimeNow(Runtime& rt, const Value&, CallArgs& args) {
  ASSIGN_OR_RETURN(std::vector<std::optional<Value>> a, BindArgs("strftime_now", args, {"format"}));
  if (!a[0]) return PyError("TypeError", "strftime_now() missing 1 required positional argument: 'format'");
  ASSIGN_OR_RETURN(std::string format, StrArg("strftime_now", "format", *a[0]));
  const int64_t micros = rt.NowMicros();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm local{};
  localtime_r(&seconds, &local);
  // Python handles %f (microseconds) itself; C's strftime does not know it.
  std::string expanded;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size() && format[i + 1] == 'f') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "%06lld", static_cast<long long>(micros % 1000000));
      expanded += buf;
      ++i;
    } else if (format[i] == '%' && i + 1 < format.size()) {
      expanded += format.substr(i, 2);
      ++i;
    } else {
      expanded.push_back(format[i]);
    }
  }
  if (expanded.size() > 1024) return PyError("ValueError", "strftime format too long");
  char buf[4096];
  const size_t n = std::strftime(buf, sizeof(buf), expanded.c_str(), &local);
  if (n == 0 && !expanded.empty()) return Value::String("");
  return Value::String(std::string(buf, n));
}

struct GlobalEntry {
  std::string_view name;
  BuiltinFn fn;
};
constexpr GlobalEntry kGlobals[] = {
    {"range", GlobalRange},
    {"dict", GlobalDict},
    {"namespace", GlobalNamespace},
    {"raise_exception", GlobalRaiseException},
    {"strftime_now", GlobalStrftimeNow},
};

}  // namespace

TestFn FindTest(std::string_view name) {
  for (const TestEntry& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

bool IsKnownTest(std::string_view name) { return FindTest(name) != nullptr; }

std::optional<Value> FindGlobal(std::string_view name) {
  for (const GlobalEntry& g : kGlobals) {
    if (g.name == name) {
      Callable c;
      c.name = std::string(name);
      c.builtin = g.fn;
      return Value::MakeCallable(std::move(c));
    }
  }
  return std::nullopt;
}

}  // namespace tandem::chat_template_internal
