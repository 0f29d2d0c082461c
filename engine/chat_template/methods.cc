// The methods of str, dict and list (and the loop object) that templates call, with
// Python's semantics on code points. Mutating methods are refused, as in transformers'
// ImmutableSandboxedEnvironment.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/builtins.h"
#include "engine/chat_template/py_text.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {
namespace {

using Args = std::vector<std::optional<Value>>;

// Python's slice index adjustment for str methods' start/end (in code points).
void AdjustRange(const std::optional<Value>& start, const std::optional<Value>& end, int64_t n, int64_t* b,
                 int64_t* e) {
  *b = 0;
  *e = n;
  if (start && start->is_integral()) *b = start->as_int();
  if (end && end->is_integral()) *e = end->as_int();
  if (*e > n) *e = n;
  if (*e < 0) *e = std::max<int64_t>(*e + n, 0);
  if (*b < 0) *b = std::max<int64_t>(*b + n, 0);
}

// The byte range of code points [b, e) of s (empty when b >= e).
std::string_view SubByCodePoints(const std::string& s, const std::vector<size_t>& offsets, int64_t b, int64_t e) {
  if (b >= e) return std::string_view();
  return std::string_view(s).substr(offsets[b], offsets[e] - offsets[b]);
}

int64_t CodePointIndex(const std::vector<size_t>& offsets, size_t byte) {
  return std::lower_bound(offsets.begin(), offsets.end(), byte) - offsets.begin();
}

absl::StatusOr<std::optional<std::string>> OptionalStr(std::string_view fn, const std::optional<Value>& v) {
  if (!v || v->is_none()) return std::optional<std::string>();
  ASSIGN_OR_RETURN(std::string s, StrArg(fn, "argument", *v));
  return std::optional<std::string>(std::move(s));
}

Value StrList(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::List(std::move(out));
}

bool IsLineBreak(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

// ---- str ----

absl::StatusOr<Value> StrAffix(const Value& self, CallArgs& args, bool prefix) {
  const char* fn = prefix ? "startswith" : "endswith";
  ASSIGN_OR_RETURN(Args a, BindArgs(fn, args, {"prefix", "start", "end"}));
  if (!a[0]) return PyError("TypeError", absl::StrCat(fn, "() takes at least 1 argument (0 given)"));
  const std::string& s = self.str();
  const std::vector<size_t> offsets = CodePointOffsets(s);
  int64_t b, e;
  AdjustRange(a[1], a[2], static_cast<int64_t>(offsets.size()) - 1, &b, &e);
  if (b > e) return Value::Bool(false);
  const std::string_view range = SubByCodePoints(s, offsets, b, e);
  std::vector<Value> candidates;
  if (a[0]->is_list() && a[0]->is_tuple()) {
    candidates = a[0]->list();
  } else {
    candidates.push_back(*a[0]);
  }
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      return PyError("TypeError", absl::StrCat(fn, " first arg must be str or a tuple of str, not ", TypeName(c)));
    }
    const std::string& x = c.str();
    if (x.size() <= range.size() &&
        (prefix ? range.substr(0, x.size()) == x : range.substr(range.size() - x.size()) == x)) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> StrStartswith(Runtime&, const Value& self, CallArgs& args) { return StrAffix(self, args, true); }
absl::StatusOr<Value> StrEndswith(Runtime&, const Value& self, CallArgs& args) { return StrAffix(self, args, false); }

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;
  for (size_t pos = 0; pos < s.size();) {
    offsets.push_back(pos);
    cps.push_back(NextCodePoint(s, &pos));
  }
  offsets.push_back(s.size());
  const int64_t n = static_cast<int64_t>(cps.size());
  auto sub = [&](int64_t i, int64_t j) { return std::string(s.substr(offsets[i], offsets[j] - offsets[i])); };
  std::vector<std::string> out;
  int64_t count = maxsplit < 0 ? INT64_MAX : maxsplit;
  if (!from_right) {
    int64_t i = 0;
    while (count-- > 0) {
      while (i < n && PyIsSpace(cps[i])) ++i;
      if (i == n) break;
      const int64_t j = i++;
      while (i < n && !PyIsSpace(cps[i])) ++i;
      out.push_back(sub(j, i));
    }
    if (i < n) {
      while (i < n && PyIsSpace(cps[i])) ++i;
      if (i != n) out.push_back(sub(i, n));
    }
    return out;
  }
  int64_t i = n - 1;
  while (count-- > 0) {
    while (i >= 0 && PyIsSpace(cps[i])) --i;
    if (i < 0) break;
    const int64_t j = i--;
    while (i >= 0 && !PyIsSpace(cps[i])) --i;
    out.push_back(sub(i + 1, j + 1));
  }
  if (i >= 0) {
    while (i >= 0 && PyIsSpace(cps[i])) --i;
    if (i >= 0) out.push_back(sub(0, i + 1));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<Value> StrSplitImpl(Runtime& rt, const Value& self, CallArgs& args, bool from_right) {
  const char* fn = from_right ? "rsplit" : "split";
  ASSIGN_OR_RETURN(Args a, BindArgs(fn, args, {"sep", "maxsplit"}));
  ASSIGN_OR_RETURN(std::optional<std::string> sep, OptionalStr(fn, a[0]));
  int64_t maxsplit = -1;
  if (a[1]) {
    ASSIGN_OR_RETURN(maxsplit, IntArg(fn, "maxsplit", *a[1]));
  }
  const std::string& s = self.str();
  RETURN_IF_ERROR(rt.Charge(s.size() * 2));
  if (!sep) return StrList(SplitWhitespace(s, maxsplit, from_right));
  if (sep->empty()) return PyError("ValueError", "empty separator");
  std::vector<std::string> parts;
  int64_t splits = 0;
  if (!from_right) {
    size_t pos = 0;
    for (size_t idx; (maxsplit < 0 || splits < maxsplit) && (idx = s.find(*sep, pos)) != std::string::npos; ++splits) {
      parts.push_back(s.substr(pos, idx - pos));
      pos = idx + sep->size();
    }
    parts.push_back(s.substr(pos));
    return StrList(std::move(parts));
  }
  size_t end = s.size();
  while (maxsplit < 0 || splits < maxsplit) {
    if (end < sep->size()) break;
    const size_t idx = s.rfind(*sep, end - sep->size());
    if (idx == std::string::npos) break;
    parts.push_back(s.substr(idx + sep->size(), end - idx - sep->size()));
    end = idx;
    ++splits;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return StrList(std::move(parts));
}

absl::StatusOr<Value> StrSplit(Runtime& rt, const Value& self, CallArgs& args) {
  return StrSplitImpl(rt, self, args, false);
}
absl::StatusOr<Value> StrRsplit(Runtime& rt, const Value& self, CallArgs& args) {
  return StrSplitImpl(rt, self, args, true);
}

absl::StatusOr<Value> StripImpl(const Value& self, CallArgs& args, bool left, bool right) {
  ASSIGN_OR_RETURN(Args a, BindArgs("strip", args, {"chars"}));
  ASSIGN_OR_RETURN(std::optional<std::string> chars, OptionalStr("strip", a[0]));
  return Value::String(PyStrip(self.str(), chars, left, right));
}
absl::StatusOr<Value> StrStrip(Runtime&, const Value& self, CallArgs& args) {
  return StripImpl(self, args, true, true);
}
absl::StatusOr<Value> StrLstrip(Runtime&, const Value& self, CallArgs& args) {
  return StripImpl(self, args, true, false);
}
absl::StatusOr<Value> StrRstrip(Runtime&, const Value& self, CallArgs& args) {
  return StripImpl(self, args, false, true);
}

}  // namespace

// Shared with the replace filter.
absl::StatusOr<std::string> PyReplace(Runtime& rt, const std::string& s, const std::string& old,
                                      const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    const std::vector<size_t> offsets = CodePointOffsets(s);
    const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    int64_t done = 0;
    RETURN_IF_ERROR(rt.Charge(s.size() + repl.size() * static_cast<size_t>(n + 1)));
    for (int64_t i = 0; i <= n; ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < n) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    }
  } else {
    size_t pos = 0;
    int64_t done = 0;
    for (size_t idx; (count < 0 || done < count) && (idx = s.find(old, pos)) != std::string::npos; ++done) {
      RETURN_IF_ERROR(rt.Charge(idx - pos + repl.size()));
      out.append(s, pos, idx - pos);
      out += repl;
      pos = idx + old.size();
    }
    out.append(s, pos, std::string::npos);
  }
  RETURN_IF_ERROR(rt.Charge(out.size()));
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool prev_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    if (IsCasedLetter(cp)) {
      if (prev_cased) {
        AppendUtf8(ToLower(cp), &out);
      } else {
        AppendUpper(cp, &out);
      }
      prev_cased = true;
    } else {
      AppendUtf8(cp, &out);
      prev_cased = false;
    }
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    if (out.empty()) {
      AppendUpper(cp, &out);
    } else {
      AppendUtf8(ToLower(cp), &out);
    }
  }
  return out;
}

namespace {

absl::StatusOr<Value> StrReplace(Runtime& rt, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("replace", args, {"old", "new", "count"}));
  if (!a[0] || !a[1]) return PyError("TypeError", "replace() expected at least 2 arguments");
  ASSIGN_OR_RETURN(std::string old, StrArg("replace", "old", *a[0]));
  ASSIGN_OR_RETURN(std::string repl, StrArg("replace", "new", *a[1]));
  int64_t count = -1;
  if (a[2]) {
    ASSIGN_OR_RETURN(count, IntArg("replace", "count", *a[2]));
  }
  ASSIGN_OR_RETURN(std::string out, PyReplace(rt, self.str(), old, repl, count));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> NoArgs(std::string_view fn, CallArgs& args) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    return PyError("TypeError", absl::StrCat(std::string(fn), "() takes no arguments"));
  }
  return Value();
}

absl::StatusOr<Value> StrUpper(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("upper", args).status());
  return Value::String(PyUpper(self.str()));
}
absl::StatusOr<Value> StrLower(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("lower", args).status());
  return Value::String(PyLower(self.str()));
}
absl::StatusOr<Value> StrTitle(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("title", args).status());
  return Value::String(PyTitle(self.str()));
}
absl::StatusOr<Value> StrCapitalize(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("capitalize", args).status());
  return Value::String(PyCapitalize(self.str()));
}

absl::StatusOr<Value> FindImpl(const Value& self, CallArgs& args, std::string_view fn, bool from_right, bool raise) {
  ASSIGN_OR_RETURN(Args a, BindArgs(fn, args, {"sub", "start", "end"}));
  if (!a[0]) return PyError("TypeError", absl::StrCat(std::string(fn), "() takes at least 1 argument (0 given)"));
  ASSIGN_OR_RETURN(std::string sub, StrArg(fn, "sub", *a[0]));
  const std::string& s = self.str();
  const std::vector<size_t> offsets = CodePointOffsets(s);
  int64_t b, e;
  AdjustRange(a[1], a[2], static_cast<int64_t>(offsets.size()) - 1, &b, &e);
  int64_t found = -1;
  if (b <= e) {
    const std::string_view range = SubByCodePoints(s, offsets, b, e);
    const size_t at = from_right ? range.rfind(sub) : range.find(sub);
    if (at != std::string_view::npos) found = CodePointIndex(offsets, offsets[b] + at);
  }
  if (found < 0 && raise) return PyError("ValueError", "substring not found");
  return Value::Int(found);
}

absl::StatusOr<Value> StrFind(Runtime&, const Value& self, CallArgs& args) {
  return FindImpl(self, args, "find", false, false);
}
absl::StatusOr<Value> StrRfind(Runtime&, const Value& self, CallArgs& args) {
  return FindImpl(self, args, "rfind", true, false);
}
absl::StatusOr<Value> StrIndex(Runtime&, const Value& self, CallArgs& args) {
  return FindImpl(self, args, "index", false, true);
}
absl::StatusOr<Value> StrRindex(Runtime&, const Value& self, CallArgs& args) {
  return FindImpl(self, args, "rindex", true, true);
}

absl::StatusOr<Value> StrCount(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("count", args, {"sub", "start", "end"}));
  if (!a[0]) return PyError("TypeError", "count() takes at least 1 argument (0 given)");
  ASSIGN_OR_RETURN(std::string sub, StrArg("count", "sub", *a[0]));
  const std::string& s = self.str();
  const std::vector<size_t> offsets = CodePointOffsets(s);
  int64_t b, e;
  AdjustRange(a[1], a[2], static_cast<int64_t>(offsets.size()) - 1, &b, &e);
  if (b > e) return Value::Int(0);
  if (sub.empty()) return Value::Int(e - b + 1);
  const std::string_view range = SubByCodePoints(s, offsets, b, e);
  int64_t n = 0;
  for (size_t pos = range.find(sub); pos != std::string_view::npos; pos = range.find(sub, pos + sub.size())) ++n;
  return Value::Int(n);
}

absl::StatusOr<Value> StrJoin(Runtime& rt, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("join", args, {"iterable"}));
  if (!a[0]) return PyError("TypeError", "join() takes exactly one argument (0 given)");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(rt, *a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return PyError("TypeError",
                     absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
    }
    if (i > 0) out += self.str();
    out += items[i].str();
  }
  RETURN_IF_ERROR(rt.Charge(out.size()));
  return Value::String(std::move(out));
}

template <bool (*Pred)(uint32_t)>
absl::StatusOr<Value> StrIs(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("is", args).status());
  const std::string& s = self.str();
  if (s.empty()) return Value::Bool(false);
  for (size_t pos = 0; pos < s.size();) {
    if (!Pred(NextCodePoint(s, &pos))) return Value::Bool(false);
  }
  return Value::Bool(true);
}
bool IsDigitCp(uint32_t cp) { return cp >= '0' && cp <= '9'; }
bool IsAlphaCp(uint32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'); }
bool IsAlnumCp(uint32_t cp) { return IsDigitCp(cp) || IsAlphaCp(cp); }

absl::StatusOr<Value> CaseCheck(const std::string& s, bool want_lower) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    if (want_lower ? IsUpperLetter(cp) : IsLowerLetter(cp)) return Value::Bool(false);
    if (IsCasedLetter(cp)) cased = true;
  }
  return Value::Bool(cased);
}
absl::StatusOr<Value> StrIsLower(Runtime&, const Value& self, CallArgs&) { return CaseCheck(self.str(), true); }
absl::StatusOr<Value> StrIsUpper(Runtime&, const Value& self, CallArgs&) { return CaseCheck(self.str(), false); }

absl::StatusOr<Value> StrSplitlines(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("splitlines", args, {"keepends"}));
  const bool keep = a[0] && Truthy(*a[0]);
  const std::string& s = self.str();
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t at = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    if (!IsLineBreak(cp)) continue;
    if (cp == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    lines.push_back(s.substr(start, (keep ? pos : at) - start));
    start = pos;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return StrList(std::move(lines));
}

absl::StatusOr<Value> StrRemovePrefix(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("removeprefix", args, {"prefix"}));
  if (!a[0]) return PyError("TypeError", "removeprefix() takes exactly one argument (0 given)");
  ASSIGN_OR_RETURN(std::string p, StrArg("removeprefix", "prefix", *a[0]));
  const std::string& s = self.str();
  return Value::String(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
}

absl::StatusOr<Value> StrRemoveSuffix(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("removesuffix", args, {"suffix"}));
  if (!a[0]) return PyError("TypeError", "removesuffix() takes exactly one argument (0 given)");
  ASSIGN_OR_RETURN(std::string p, StrArg("removesuffix", "suffix", *a[0]));
  const std::string& s = self.str();
  if (!p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0) {
    return Value::String(s.substr(0, s.size() - p.size()));
  }
  return Value::String(s);
}

absl::StatusOr<Value> StrFormat(Runtime&, const Value&, CallArgs&) {
  return PyError("SecurityError", "str.format is not supported by this interpreter");
}

// ---- dict ----

absl::StatusOr<Value> DictItems(Runtime& rt, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("items", args).status());
  RETURN_IF_ERROR(rt.Charge(self.dict().size() * 3 * sizeof(Value)));
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().entries()) out.push_back(Value::List({Value::String(k), v}, true));
  return Value::List(std::move(out));
}
absl::StatusOr<Value> DictKeys(Runtime& rt, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("keys", args).status());
  RETURN_IF_ERROR(rt.Charge(self.dict().size() * sizeof(Value)));
  return Value::List(*Iterate(rt, self));
}
absl::StatusOr<Value> DictValues(Runtime& rt, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("values", args).status());
  RETURN_IF_ERROR(rt.Charge(self.dict().size() * sizeof(Value)));
  std::vector<Value> out;
  for (const auto& [k, v] : self.dict().entries()) out.push_back(v);
  return Value::List(std::move(out));
}
absl::StatusOr<Value> DictGet(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("get", args, {"key", "default"}));
  if (!a[0]) return PyError("TypeError", "get expected at least 1 argument, got 0");
  if (a[0]->is_string()) {
    if (const Value* v = self.dict().Find(a[0]->str())) return *v;
  }
  return a[1] ? *a[1] : Value::None();
}
absl::StatusOr<Value> Copy(Runtime&, const Value& self, CallArgs& args) {
  RETURN_IF_ERROR(NoArgs("copy", args).status());
  return self;  // immutable: a copy is indistinguishable
}

// ---- list ----

absl::StatusOr<Value> ListIndex(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("index", args, {"value"}));
  if (!a[0]) return PyError("TypeError", "index expected at least 1 argument, got 0");
  const std::vector<Value>& items = self.list();
  for (size_t i = 0; i < items.size(); ++i) {
    if (PyEquals(items[i], *a[0])) return Value::Int(static_cast<int64_t>(i));
  }
  return PyError("ValueError", absl::StrCat(PyRepr(*a[0]), " is not in list"));
}
absl::StatusOr<Value> ListCount(Runtime&, const Value& self, CallArgs& args) {
  ASSIGN_OR_RETURN(Args a, BindArgs("count", args, {"value"}));
  if (!a[0]) return PyError("TypeError", "count() takes exactly one argument (0 given)");
  int64_t n = 0;
  for (const Value& v : self.list()) n += PyEquals(v, *a[0]) ? 1 : 0;
  return Value::Int(n);
}

// ---- loop ----

absl::StatusOr<Value> LoopCycle(Runtime&, const Value& self, CallArgs& args) {
  if (args.positional.empty()) return PyError("TypeError", "no items for cycling given");
  return args.positional[self.loop().index0 % static_cast<int64_t>(args.positional.size())];
}
absl::StatusOr<Value> LoopChanged(Runtime&, const Value& self, CallArgs& args) {
  LoopState& l = self.loop();
  for (const Value& a : args.positional) {
    if (ContainsKind(a, Kind::kLoop)) return PyError("TypeError", "loop.changed() of a loop object is not supported");
  }
  bool changed = !l.last_changed || l.last_changed->size() != args.positional.size();
  for (size_t i = 0; !changed && i < args.positional.size(); ++i) {
    changed = !PyEquals((*l.last_changed)[i], args.positional[i]);
  }
  if (changed) l.last_changed = args.positional;
  return Value::Bool(changed);
}

struct MethodEntry {
  std::string_view name;
  BuiltinFn fn;  // null: refused by the sandbox
};

constexpr MethodEntry kStrMethods[] = {
    {"startswith", StrStartswith},
    {"endswith", StrEndswith},
    {"split", StrSplit},
    {"rsplit", StrRsplit},
    {"strip", StrStrip},
    {"lstrip", StrLstrip},
    {"rstrip", StrRstrip},
    {"replace", StrReplace},
    {"upper", StrUpper},
    {"lower", StrLower},
    {"title", StrTitle},
    {"capitalize", StrCapitalize},
    {"find", StrFind},
    {"rfind", StrRfind},
    {"index", StrIndex},
    {"rindex", StrRindex},
    {"count", StrCount},
    {"join", StrJoin},
    {"isdigit", StrIs<IsDigitCp>},
    {"isdecimal", StrIs<IsDigitCp>},
    {"isnumeric", StrIs<IsDigitCp>},
    {"isalpha", StrIs<IsAlphaCp>},
    {"isalnum", StrIs<IsAlnumCp>},
    {"isspace", StrIs<PyIsSpace>},
    {"islower", StrIsLower},
    {"isupper", StrIsUpper},
    {"splitlines", StrSplitlines},
    {"removeprefix", StrRemovePrefix},
    {"removesuffix", StrRemoveSuffix},
    {"format", StrFormat},
    {"format_map", StrFormat},
};
constexpr MethodEntry kDictMethods[] = {
    {"items", DictItems}, {"keys", DictKeys}, {"values", DictValues}, {"get", DictGet},        {"copy", Copy},
    {"clear", nullptr},   {"pop", nullptr},   {"popitem", nullptr},   {"setdefault", nullptr}, {"update", nullptr},
};
constexpr MethodEntry kListMethods[] = {
    {"index", ListIndex}, {"count", ListCount}, {"copy", Copy},      {"append", nullptr},
    {"clear", nullptr},   {"extend", nullptr},  {"insert", nullptr}, {"pop", nullptr},
    {"remove", nullptr},  {"reverse", nullptr}, {"sort", nullptr},
};
constexpr MethodEntry kTupleMethods[] = {{"index", ListIndex}, {"count", ListCount}};
constexpr MethodEntry kLoopMethods[] = {{"cycle", LoopCycle}, {"changed", LoopChanged}};

template <size_t N>
std::optional<Value> Lookup(const MethodEntry (&table)[N], const Value& obj, std::string_view name, bool* unsafe) {
  for (const MethodEntry& m : table) {
    if (m.name != name) continue;
    if (m.fn == nullptr) {
      *unsafe = true;
      return std::nullopt;
    }
    Callable c;
    c.name = std::string(name);
    c.builtin = m.fn;
    c.self = std::make_shared<const Value>(obj);
    return Value::MakeCallable(std::move(c));
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> FindMethod(const Value& obj, std::string_view name, bool* unsafe) {
  *unsafe = false;
  switch (obj.kind()) {
    case Kind::kString:
      return Lookup(kStrMethods, obj, name, unsafe);
    case Kind::kDict:
      return Lookup(kDictMethods, obj, name, unsafe);
    case Kind::kList:
      return obj.is_tuple() ? Lookup(kTupleMethods, obj, name, unsafe) : Lookup(kListMethods, obj, name, unsafe);
    case Kind::kLoop:
      return Lookup(kLoopMethods, obj, name, unsafe);
    default:
      return std::nullopt;
  }
}

}  // namespace tandem::chat_template_internal
