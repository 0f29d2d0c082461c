#include "engine/chat_template/operators.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/py_text.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {
namespace {

absl::Status Unsupported(std::string_view op, const Value& a, const Value& b) {
  return PyError("TypeError", absl::StrCat("unsupported operand type(s) for ", std::string(op), ": '", TypeName(a),
                                           "' and '", TypeName(b), "'"));
}

absl::Status Overflow() {
  return PyError("OverflowError", "integer result does not fit in 64 bits (Python's unbounded ints are not supported)");
}

bool IsDunder(std::string_view name) {
  return name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__";
}

std::string ObjectRepr(const Value& obj) {
  if (obj.is_none()) return "'None'";
  return absl::StrCat("'", TypeName(obj), " object'");
}

Value NoAttribute(const Value& obj, std::string_view name) {
  return Value::Undefined(absl::StrCat(ObjectRepr(obj), " has no attribute '", std::string(name), "'"));
}

Value NoElement(const Value& obj, const Value& key) {
  return Value::Undefined(absl::StrCat(ObjectRepr(obj), " has no element ", PyRepr(key)));
}

Value Unsafe(const Value& obj, std::string_view name) {
  return Value::Undefined(
      absl::StrCat("access to attribute '", std::string(name), "' of '", TypeName(obj), "' object is unsafe."), true);
}

// A method of `obj` (bound), the sandbox's refusal, or nullopt.
std::optional<Value> MethodOrUnsafe(const Value& obj, std::string_view name) {
  bool unsafe = false;
  std::optional<Value> m = FindMethod(obj, name, &unsafe);
  if (unsafe) return Unsafe(obj, name);
  if (m) return m;
  if (IsDunder(name)) return Unsafe(obj, name);
  return std::nullopt;
}

Value LoopAttr(const Value& obj, std::string_view name) {
  const LoopState& l = obj.loop();
  const int64_t n = static_cast<int64_t>(l.items->size());
  const int64_t i = l.index0;
  if (name == "index") return Value::Int(i + 1);
  if (name == "index0") return Value::Int(i);
  if (name == "revindex") return Value::Int(n - i);
  if (name == "revindex0") return Value::Int(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Int(n);
  if (name == "depth") return Value::Int(l.depth0 + 1);
  if (name == "depth0") return Value::Int(l.depth0);
  if (name == "previtem") return i > 0 ? (*l.items)[i - 1] : Value::Undefined("there is no previous item");
  if (name == "nextitem") return i + 1 < n ? (*l.items)[i + 1] : Value::Undefined("there is no next item");
  if (std::optional<Value> m = MethodOrUnsafe(obj, name)) return *m;
  return NoAttribute(obj, name);
}

// Python's float // and % (floatobject.c's float_divmod).
void FloatDivMod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

absl::StatusOr<Value> Repeat(Runtime& rt, const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value::String("", seq.markup()) : Value::List({}, seq.is_tuple());
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size() * sizeof(Value);
  if (unit > 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 40) / unit) {
    return PyError("MemoryError", "repetition too large");
  }
  RETURN_IF_ERROR(rt.Charge(unit * static_cast<size_t>(n)));
  if (seq.is_string()) {
    std::string out;
    out.reserve(seq.str().size() * n);
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::String(std::move(out), seq.markup());
  }
  std::vector<Value> out;
  out.reserve(seq.list().size() * n);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::List(std::move(out), seq.is_tuple());
}

// Python's str % args for the conversions templates might use: %s %r %a %d %i %u %f %F
// %e %E %g %G %x %X %o %c %%, with flags, width, precision and %(key)s.
absl::StatusOr<Value> PercentFormat(Runtime& rt, const std::string& fmt, const Value& arg) {
  std::vector<Value> args;
  const bool tuple = arg.is_list() && arg.is_tuple();
  // Python treats any non-tuple, non-str object with __getitem__ as a mapping argument,
  // which a format without conversions may ignore.
  const bool mapping_like = (arg.is_list() && !tuple) || arg.is_dict() || arg.is_undefined();
  if (tuple) {
    args = arg.list();
  } else {
    args.push_back(arg);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return PyError("ValueError", "incomplete format");
    std::optional<Value> value;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) return PyError("ValueError", "incomplete format key");
      if (!arg.is_dict()) return PyError("TypeError", "format requires a mapping");
      const Value* v = arg.dict().Find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (v == nullptr) return PyError("KeyError", PyReprString(fmt.substr(i + 1, close - i - 1)));
      value = *v;
      used_mapping = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) spec += fmt[i++];
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec += fmt[i++];
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) return PyError("ValueError", "incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!value) {
      if (next >= args.size()) return PyError("TypeError", "not enough arguments for format string");
      value = args[next++];
    }
    char buf[512];
    if (conv == 's' || conv == 'r' || conv == 'a') {
      const std::string text = conv == 's' ? PyStr(*value) : PyRepr(*value);
      // Width and precision count code points; pad by hand.
      const size_t dot = spec.find('.');
      std::string body = text;
      if (dot != std::string::npos) {
        const size_t precision = std::strtoul(spec.c_str() + dot + 1, nullptr, 10);
        const std::vector<size_t> offsets = CodePointOffsets(body);
        if (precision + 1 < offsets.size()) body.resize(offsets[precision]);
      }
      const size_t width_at = spec.find_first_of("123456789");
      const size_t width = width_at != std::string::npos && (dot == std::string::npos || width_at < dot)
                               ? std::strtoul(spec.c_str() + width_at, nullptr, 10)
                               : 0;
      const size_t n = CodePointCount(body);
      if (n < width) {
        const std::string pad(width - n, ' ');
        body = spec.find('-') != std::string::npos ? body + pad : pad + body;
      }
      out += body;
    } else if (std::string_view("diuxXoc").find(conv) != std::string_view::npos) {
      int64_t n;
      if (conv == 'c' && value->is_string()) {
        if (CodePointCount(value->str()) != 1) return PyError("TypeError", "%c requires int or char");
        out += value->str();
        continue;
      }
      if (value->is_integral()) {
        n = value->as_int();
      } else if (value->kind() == Kind::kFloat && conv != 'x' && conv != 'X' && conv != 'o' && conv != 'c') {
        if (!std::isfinite(value->as_float()) || std::fabs(value->as_float()) >= 9.2e18) return Overflow();
        n = static_cast<int64_t>(value->as_float());
      } else {
        return PyError("TypeError", absl::StrCat("%", std::string(1, conv), " format: a real number is required, not ",
                                                 TypeName(*value)));
      }
      if (conv == 'c') {
        if (n < 0 || n > 0x10FFFF) return PyError("OverflowError", "%c arg not in range(0x110000)");
        AppendUtf8(static_cast<uint32_t>(n), &out);
        continue;
      }
      const char c = conv == 'i' || conv == 'u' ? 'd' : conv;
      std::snprintf(buf, sizeof(buf), (spec + "ll" + c).c_str(), static_cast<long long>(n));
      out += buf;
    } else if (std::string_view("fFeEgG").find(conv) != std::string_view::npos) {
      if (!value->is_number()) {
        return PyError("TypeError", absl::StrCat("must be real number, not ", TypeName(*value)));
      }
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), value->as_float());
      out += buf;
    } else {
      return PyError("ValueError", absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
    }
    if (out.size() > (size_t{1} << 30)) return PyError("MemoryError", "format result too large");
  }
  if (next < args.size() && !used_mapping && !(next == 0 && mapping_like)) {
    return PyError("TypeError", "not all arguments converted during string formatting");
  }
  RETURN_IF_ERROR(rt.Charge(out.size()));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Add(Runtime& rt, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
      return Value::Int(r);
    }
    return Value::Float(a.as_float() + b.as_float());
  }
  if (a.is_string() && b.is_string()) {
    RETURN_IF_ERROR(rt.Charge(a.str().size() + b.str().size()));
    if (a.markup() && !b.markup()) return Value::String(a.str() + HtmlEscape(b.str()), true);
    if (b.markup() && !a.markup()) return Value::String(HtmlEscape(a.str()) + b.str(), true);
    return Value::String(a.str() + b.str(), a.markup());
  }
  if (a.is_string()) {
    return PyError("TypeError", absl::StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    RETURN_IF_ERROR(rt.Charge((a.list().size() + b.list().size()) * sizeof(Value)));
    std::vector<Value> out(a.list());
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value::List(std::move(out), a.is_tuple());
  }
  if (a.is_list()) {
    return PyError("TypeError",
                   absl::StrCat("can only concatenate ", TypeName(a), " (not \"", TypeName(b), "\") to ", TypeName(a)));
  }
  return Unsupported("+", a, b);
}

absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) return Unsupported(op, a, b);
  const bool ints = a.is_integral() && b.is_integral();
  if (op == "/") {
    if (b.as_float() == 0) return PyError("ZeroDivisionError", "division by zero");
    return Value::Float(a.as_float() / b.as_float());
  }
  if (ints) {
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r;
    if (op == "-") {
      if (__builtin_sub_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    }
    if (op == "*") {
      if (__builtin_mul_overflow(x, y, &r)) return Overflow();
      return Value::Int(r);
    }
    if (op == "//" || op == "%") {
      if (y == 0) return PyError("ZeroDivisionError", "integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) return Overflow();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        --q;
      }
      return Value::Int(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) {
        if (x == 0) return PyError("ZeroDivisionError", "0.0 cannot be raised to a negative power");
        return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
      int64_t result = 1, base = x, e = y;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return Overflow();
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
      }
      return Value::Int(result);
    }
  }
  const double x = a.as_float(), y = b.as_float();
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "//" || op == "%") {
    if (y == 0) return PyError("ZeroDivisionError", "float floor division by zero");
    double fd, m;
    FloatDivMod(x, y, &fd, &m);
    return Value::Float(op == "//" ? fd : m);
  }
  if (op == "**") {
    if (x == 0 && y < 0) return PyError("ZeroDivisionError", "0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) return PyError("ValueError", "complex results are not supported");
    return Value::Float(std::pow(x, y));
  }
  return Unsupported(op, a, b);
}

}  // namespace

absl::StatusOr<Value> BinaryOp(Runtime& rt, std::string_view op, const Value& a, const Value& b) {
  // str % x: str.__mod__ takes any object, an Undefined too (it formats as "").
  if (op == "%" && a.is_string()) return PercentFormat(rt, a.str(), b);
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "+") return Add(rt, a, b);
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_integral()) return Repeat(rt, a, b.as_int());
    if (a.is_integral() && (b.is_string() || b.is_list())) return Repeat(rt, b, a.as_int());
  }
  return Arithmetic(op, a, b);
}

absl::StatusOr<Value> Negate(const Value& a) {
  if (a.is_undefined()) return UndefinedError(a);
  if (a.is_integral()) {
    if (a.as_int() == std::numeric_limits<int64_t>::min()) return Overflow();
    return Value::Int(-a.as_int());
  }
  if (a.kind() == Kind::kFloat) return Value::Float(-a.as_float());
  return PyError("TypeError", absl::StrCat("bad operand type for unary -: '", TypeName(a), "'"));
}

absl::StatusOr<Value> UnaryPlus(const Value& a) {
  if (a.is_undefined()) return UndefinedError(a);
  if (a.is_integral()) return Value::Int(a.as_int());
  if (a.kind() == Kind::kFloat) return a;
  return PyError("TypeError", absl::StrCat("bad operand type for unary +: '", TypeName(a), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;  // Undefined iterates as empty
    case Kind::kString:
      if (!item.is_string()) {
        return PyError("TypeError",
                       absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.list()) {
        if (PyEquals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (item.is_list() && !item.is_tuple()) return PyError("TypeError", "unhashable type: 'list'");
      if (item.is_dict()) return PyError("TypeError", "unhashable type: 'dict'");
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default:
      return PyError("TypeError", absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<bool> CompareOp(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return PyEquals(a, b);
  if (op == "!=") return !PyEquals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") {
    ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return !in;
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  absl::StatusOr<int> c = PyCompare(a, b);
  if (!c.ok()) {
    return PyError("TypeError", absl::StrCat("'", std::string(op), "' not supported between instances of '",
                                             TypeName(a), "' and '", TypeName(b), "'"));
  }
  if (op == "<") return *c < 0;
  if (op == "<=") return *c <= 0;
  if (op == ">") return *c > 0;
  return *c >= 0;
}

absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      return UndefinedError(obj);
    case Kind::kDict: {
      if (std::optional<Value> m = MethodOrUnsafe(obj, name)) return *m;
      if (const Value* v = obj.dict().Find(name)) return *v;
      return NoAttribute(obj, name);
    }
    case Kind::kNamespace: {
      if (const Value* v = obj.ns().attrs.Find(name)) return *v;
      return NoAttribute(obj, name);
    }
    case Kind::kLoop:
      return LoopAttr(obj, name);
    case Kind::kString:
    case Kind::kList:
      if (std::optional<Value> m = MethodOrUnsafe(obj, name)) return *m;
      return NoAttribute(obj, name);
    default:
      if (IsDunder(name)) return Unsafe(obj, name);
      return NoAttribute(obj, name);
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      return UndefinedError(obj);
    case Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().Find(key.str())) return *v;
        if (std::optional<Value> m = MethodOrUnsafe(obj, key.str())) return *m;
        return NoAttribute(obj, key.str());
      }
      return NoElement(obj, key);
    case Kind::kList:
    case Kind::kString: {
      if (key.is_string()) return GetAttr(obj, key.str());
      if (!key.is_integral()) return NoElement(obj, key);
      int64_t i = key.as_int();
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return NoElement(obj, key);
        return obj.list()[i];
      }
      const std::vector<size_t> offsets = CodePointOffsets(obj.str());
      const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return NoElement(obj, key);
      return Value::String(obj.str().substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    case Kind::kNamespace:
    case Kind::kLoop:
      if (key.is_string()) return GetAttr(obj, key.str());
      return NoElement(obj, key);
    default:
      return key.is_string() ? NoAttribute(obj, key.str()) : NoElement(obj, key);
  }
}

absl::StatusOr<Value> Slice(Runtime& rt, const Value& obj, const std::optional<Value>& start,
                            const std::optional<Value>& stop, const std::optional<Value>& step) {
  // Jinja2 compiles a slice to Python's own subscript, not to environment.getitem:
  // failures raise rather than give Undefined.
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) return PyError("TypeError", "unhashable type: 'slice'");
  if (!obj.is_list() && !obj.is_string()) {
    return PyError("TypeError", absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  auto bound = [](const std::optional<Value>& v, std::optional<int64_t>* out) {
    if (!v || v->is_none()) return true;
    if (!v->is_integral()) return false;
    *out = v->as_int();
    return true;
  };
  std::optional<int64_t> b, e, s;
  if (!bound(start, &b) || !bound(stop, &e) || !bound(step, &s)) {
    return PyError("TypeError", "slice indices must be integers or None or have an __index__ method");
  }
  const int64_t st = s.value_or(1);
  if (st == 0) return PyError("ValueError", "slice step cannot be zero");
  std::vector<size_t> offsets;
  int64_t n;
  if (obj.is_string()) {
    offsets = CodePointOffsets(obj.str());
    n = static_cast<int64_t>(offsets.size()) - 1;
  } else {
    n = static_cast<int64_t>(obj.list().size());
  }
  auto adjust = [&](std::optional<int64_t> v, bool is_start) -> int64_t {
    if (!v) return is_start ? (st < 0 ? n - 1 : 0) : (st < 0 ? -1 : n);
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t from = adjust(b, true), to = adjust(e, false);
  std::vector<int64_t> picks;
  for (int64_t i = from; st > 0 ? i < to : i > to; i += st) picks.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : picks) out.append(obj.str(), offsets[i], offsets[i + 1] - offsets[i]);
    RETURN_IF_ERROR(rt.Charge(out.size()));
    return Value::String(std::move(out), obj.markup());
  }
  RETURN_IF_ERROR(rt.Charge(picks.size() * sizeof(Value)));
  std::vector<Value> out;
  out.reserve(picks.size());
  for (int64_t i : picks) out.push_back(obj.list()[i]);
  return Value::List(std::move(out), obj.is_tuple());
}

}  // namespace tandem::chat_template_internal
