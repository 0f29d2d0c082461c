#include "engine/grammar/json_values.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/grammar/regex_to_grammar.h"
#include "engine/grammar/utf8_ranges.h"
#include "kernels/common/check.h"

namespace tandem::grammar::json_values {
namespace {

Expr Lit(std::string_view s) { return Expr::Literal(s); }
Expr Digit() { return Expr::Class({{'0', '9'}}, false); }
Expr NonZeroDigit() { return Expr::Class({{'1', '9'}}, false); }
Expr Digits(int n) { return Expr::Repeat(Digit(), n, n); }
Expr Seq(std::vector<Expr> v) { return Expr::Sequence(std::move(v)); }
Expr Alt(std::vector<Expr> v) { return Expr::Choice(std::move(v)); }
Expr Never() { return Expr::Class({}, false); }

// Code points JSON strings must escape.
const std::vector<CodepointRange>& EscapedRanges() {
  static const auto* r = new std::vector<CodepointRange>{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  return *r;
}

Expr RawChar() { return Expr::Class(EscapedRanges(), true); }

Expr Hex() { return Expr::Class({{'0', '9'}, {'A', 'F'}, {'a', 'f'}}, false); }

std::string EscapeCodepoint(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return absl::StrFormat("\\u%04x", c);
  }
}

// Decimal digit strings without leading zeros.
bool AllOf(std::string_view s, char c) {
  return std::all_of(s.begin(), s.end(), [c](char x) { return x == c; });
}

Expr GreaterEq(std::string_view s) {  // digit strings of len(s) >= s
  if (s.empty()) return Expr::Empty();
  if (AllOf(s, '0')) return Digits(static_cast<int>(s.size()));
  std::vector<Expr> alts;
  alts.push_back(Seq({Lit(s.substr(0, 1)), GreaterEq(s.substr(1))}));
  if (s[0] < '9') {
    alts.push_back(Seq({Expr::Class({{static_cast<uint32_t>(s[0] + 1), '9'}}, false),
                        Digits(static_cast<int>(s.size()) - 1)}));
  }
  return Alt(std::move(alts));
}

Expr LessEq(std::string_view s) {  // digit strings of len(s) <= s
  if (s.empty()) return Expr::Empty();
  if (AllOf(s, '9')) return Digits(static_cast<int>(s.size()));
  std::vector<Expr> alts;
  alts.push_back(Seq({Lit(s.substr(0, 1)), LessEq(s.substr(1))}));
  if (s[0] > '0') {
    alts.push_back(Seq({Expr::Class({{'0', static_cast<uint32_t>(s[0] - 1)}}, false),
                        Digits(static_cast<int>(s.size()) - 1)}));
  }
  return Alt(std::move(alts));
}

// Digit strings of one length between x and y.
Expr SameLength(std::string_view x, std::string_view y) {
  if (x.empty()) return Expr::Empty();
  if (x == y) return Lit(x);
  if (x[0] == y[0]) return Seq({Lit(x.substr(0, 1)), SameLength(x.substr(1), y.substr(1))});
  std::vector<Expr> alts;
  alts.push_back(Seq({Lit(x.substr(0, 1)), GreaterEq(x.substr(1))}));
  if (x[0] + 1 <= y[0] - 1) {
    alts.push_back(Seq({Expr::Class({{static_cast<uint32_t>(x[0] + 1), static_cast<uint32_t>(y[0] - 1)}}, false),
                        Digits(static_cast<int>(x.size()) - 1)}));
  }
  alts.push_back(Seq({Lit(y.substr(0, 1)), LessEq(y.substr(1))}));
  return Alt(std::move(alts));
}

// Unsigned integers in [a, b] (b unbounded when nullopt), without leading zeros.
Expr UnsignedRange(uint64_t a, std::optional<uint64_t> b) {
  if (b && *b < a) return Never();
  const std::string sa = std::to_string(a);
  const std::string sb = b ? std::to_string(*b) : std::string();
  std::vector<Expr> alts;
  const size_t la = sa.size(), lb = b ? sb.size() : sa.size();
  for (size_t d = la; d <= lb; ++d) {
    const std::string lo = d == la ? sa : "1" + std::string(d - 1, '0');
    const std::string hi = (b && d == lb) ? sb : std::string(d, '9');
    alts.push_back(SameLength(lo, hi));
  }
  if (!b) alts.push_back(Seq({NonZeroDigit(), Expr::Repeat(Digit(), static_cast<int>(la), -1)}));
  return Alt(std::move(alts));
}

uint64_t Magnitude(int64_t v) { return v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

enum class Frac { kAny, kZero, kNonZero };

Expr FracExpr(Frac f) {
  switch (f) {
    case Frac::kAny: return Expr::Optional(Seq({Lit("."), Expr::Plus(Digit())}));
    case Frac::kZero: return Expr::Optional(Seq({Lit("."), Expr::Plus(Lit("0"))}));
    case Frac::kNonZero: return Seq({Lit("."), Expr::Star(Digit()), NonZeroDigit(), Expr::Star(Digit())});
  }
  return Expr::Empty();
}

struct MagBound {
  uint64_t value;
  bool strict;
};

// Non-negative decimals I(.F)? with magnitude constraints, as pieces of integer-part
// ranges with a condition on the fraction at their ends (see NumberRange).
void MagnitudePieces(std::string_view sign, std::optional<MagBound> lo, std::optional<MagBound> hi,
                     std::vector<Expr>* out) {
  struct Piece {
    uint64_t lo;
    std::optional<uint64_t> hi;
    Frac frac;
  };
  std::vector<Piece> lower;
  if (!lo) {
    lower.push_back({0, std::nullopt, Frac::kAny});
  } else if (lo->strict) {
    lower.push_back({lo->value, lo->value, Frac::kNonZero});
    lower.push_back({lo->value + 1, std::nullopt, Frac::kAny});
  } else {
    lower.push_back({lo->value, std::nullopt, Frac::kAny});
  }
  const auto emit = [&](uint64_t a, std::optional<uint64_t> b, Frac f) {
    out->push_back(Seq({Lit(sign), UnsignedRange(a, b), FracExpr(f)}));
  };
  for (const Piece& p : lower) {
    if (!hi) {
      emit(p.lo, p.hi, p.frac);
      continue;
    }
    if (hi->value >= 1) {  // integer part <= hi - 1: any fraction
      const uint64_t top = p.hi ? std::min(*p.hi, hi->value - 1) : hi->value - 1;
      if (p.lo <= top) emit(p.lo, top, p.frac);
    }
    if (!hi->strict && p.lo <= hi->value && (!p.hi || hi->value <= *p.hi) && p.frac != Frac::kNonZero) {
      emit(hi->value, hi->value, Frac::kZero);
    }
  }
}

}  // namespace

Expr StringChar() {
  const Expr short_escape = Seq({Lit("\\"), Expr::Class({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                         {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}},
                                                        false)});
  // \u of a non-surrogate: first digit not d/D, or d/D followed by 0-7.
  const Expr bmp = Seq({Lit("\\u"), Alt({Seq({Expr::Class({{'0', '9'}, {'A', 'C'}, {'E', 'F'}, {'a', 'c'},
                                                            {'e', 'f'}},
                                                           false),
                                              Hex(), Hex(), Hex()}),
                                         Seq({Expr::Class({{'D', 'D'}, {'d', 'd'}}, false),
                                              Expr::Class({{'0', '7'}}, false), Hex(), Hex()})})});
  const Expr pair = Seq({Lit("\\u"), Expr::Class({{'D', 'D'}, {'d', 'd'}}, false),
                         Expr::Class({{'8', '9'}, {'A', 'B'}, {'a', 'b'}}, false), Hex(), Hex(), Lit("\\u"),
                         Expr::Class({{'D', 'D'}, {'d', 'd'}}, false),
                         Expr::Class({{'C', 'F'}, {'c', 'f'}}, false), Hex(), Hex()});
  return Alt({RawChar(), short_escape, bmp, pair});
}

Expr Integer() {
  return Seq({Expr::Optional(Lit("-")), Alt({Lit("0"), Seq({NonZeroDigit(), Expr::Star(Digit())})})});
}

Expr Number() {
  return Seq({Integer(), Expr::Optional(Seq({Lit("."), Expr::Plus(Digit())})),
              Expr::Optional(Seq({Expr::Class({{'E', 'E'}, {'e', 'e'}}, false),
                                  Expr::Optional(Expr::Class({{'+', '+'}, {'-', '-'}}, false)),
                                  Expr::Plus(Digit())}))});
}

Expr IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  if (!hi || *hi >= 0) {
    alts.push_back(UnsignedRange(lo ? Magnitude(std::max<int64_t>(*lo, 0)) : 0,
                                 hi ? std::optional<uint64_t>(Magnitude(*hi)) : std::nullopt));
  }
  if (!lo || *lo < 0) {
    const uint64_t mag_lo = (hi && *hi < 0) ? Magnitude(*hi) : 1;
    alts.push_back(Seq({Lit("-"), UnsignedRange(mag_lo, lo ? std::optional<uint64_t>(Magnitude(*lo)) : std::nullopt)}));
  }
  if (alts.empty()) return Never();
  return Alt(std::move(alts));
}

Expr NumberRange(std::optional<Bound> lo, std::optional<Bound> hi) {
  std::vector<Expr> alts;
  // x >= 0, written without a sign.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    std::optional<MagBound> mlo;
    if (lo && (lo->value > 0 || (lo->value == 0 && lo->exclusive))) mlo = MagBound{Magnitude(lo->value), lo->exclusive};
    std::optional<MagBound> mhi;
    if (hi) mhi = MagBound{Magnitude(hi->value), hi->exclusive};
    MagnitudePieces("", mlo, mhi, &alts);
  }
  // x < 0 as "-" and a magnitude m > 0: x >= lo is m <= -lo; x <= hi is m >= -hi.
  if (!lo || lo->value < 0) {
    std::optional<MagBound> mhi;
    if (lo) mhi = MagBound{Magnitude(lo->value), lo->exclusive};
    MagBound mlo{0, true};
    if (hi && hi->value < 0) mlo = MagBound{Magnitude(hi->value), hi->exclusive};
    MagnitudePieces("-", mlo, mhi, &alts);
  }
  if (alts.empty()) return Never();
  return Alt(std::move(alts));
}

absl::StatusOr<Expr> FormatContent(std::string_view format) {
  // Subsets of what ajv-formats' "full" formats accept, written here from RFC 3339 and
  // RFC 4122 (see json_schema_to_grammar.h).
  static const std::string kDate =
      "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|"
      "02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)";
  static const std::string kTime =
      "(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d))";
  static const std::string kEmailAtom = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+";
  static const std::string kLabel = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?";
  static const std::string kOctet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  std::string pattern;
  if (format == "date") {
    pattern = kDate;
  } else if (format == "time") {
    pattern = kTime;
  } else if (format == "date-time") {
    pattern = kDate + "T" + kTime;
  } else if (format == "email") {
    pattern = kEmailAtom + "(?:\\." + kEmailAtom + ")*@(?:" + kLabel + "\\.)+" + kLabel;
  } else if (format == "uuid") {
    pattern = "[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}";
  } else if (format == "ipv4") {
    pattern = "(?:" + kOctet + "\\.){3}" + kOctet;
  } else {
    return absl::NotFoundError(absl::StrCat("format '", std::string(format), "'"));
  }
  absl::StatusOr<Expr> e = RegexToExpr(pattern);
  TANDEM_CHECK(e.ok()) << e.status();
  return e;
}

Expr EscapeForJsonString(const Expr& content) {
  switch (content.kind) {
    case Expr::Kind::kClass: {
      const std::vector<CodepointRange> ranges = NormalizeClass(content.ranges, content.negated);
      std::vector<CodepointRange> raw, special;
      for (const CodepointRange& r : ranges) {
        uint32_t lo = r.lo;
        for (const CodepointRange& e : EscapedRanges()) {
          if (e.hi < lo || e.lo > r.hi) continue;
          if (e.lo > lo) raw.push_back({lo, e.lo - 1});
          special.push_back({std::max(lo, e.lo), std::min(r.hi, e.hi)});
          lo = e.hi + 1;
        }
        if (lo <= r.hi) raw.push_back({lo, r.hi});
      }
      std::vector<Expr> alts;
      if (!raw.empty()) alts.push_back(Expr::Class(std::move(raw), false, content.pos));
      for (const CodepointRange& s : special) {
        for (uint32_t c = s.lo; c <= s.hi; ++c) alts.push_back(Lit(EscapeCodepoint(c)));
      }
      if (alts.empty()) return Never();
      return Alt(std::move(alts));
    }
    case Expr::Kind::kLiteral: {
      std::vector<Expr> seq;
      size_t i = 0;
      while (i < content.text.size()) {
        const int32_t cp = DecodeCodepoint(content.text, &i);
        TANDEM_CHECK(cp >= 0);
        seq.push_back(EscapeForJsonString(Expr::Char(static_cast<uint32_t>(cp))));
      }
      return Seq(std::move(seq));
    }
    case Expr::Kind::kSequence:
    case Expr::Kind::kChoice:
    case Expr::Kind::kRepeat: {
      Expr out = content;
      for (Expr& c : out.children) c = EscapeForJsonString(c);
      return out;
    }
    case Expr::Kind::kEmpty:
    case Expr::Kind::kRule:
      return content;
  }
  return content;
}

std::string QuoteString(std::string_view utf8) {
  std::string out = "\"";
  for (char c : utf8) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (b < 0x20 || c == '"' || c == '\\') {
      out += EscapeCodepoint(b);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string Serialize(const nlohmann::ordered_json& value, const Separators& sep) {
  if (value.is_string()) return QuoteString(value.get<std::string>());
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += sep.item;
      out += Serialize(value[i], sep);
    }
    return out + "]";
  }
  if (value.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!first) out += sep.item;
      first = false;
      out += QuoteString(it.key()) + sep.key + Serialize(it.value(), sep);
    }
    return out + "}";
  }
  return value.dump();
}

Expr ContentNotIn(const std::vector<std::string>& excluded) {
  struct Node {
    bool terminal = false;
    std::map<uint32_t, std::unique_ptr<Node>> children;
  };
  Node root;
  for (const std::string& s : excluded) {
    Node* n = &root;
    size_t i = 0;
    while (i < s.size()) {
      const int32_t cp = DecodeCodepoint(s, &i);
      TANDEM_CHECK(cp >= 0);
      auto& child = n->children[static_cast<uint32_t>(cp)];
      if (!child) child = std::make_unique<Node>();
      n = child.get();
    }
    n->terminal = true;
  }
  const auto build = [](const auto& self, const Node& n) -> Expr {
    std::vector<Expr> alts;
    if (!n.terminal) alts.push_back(Expr::Empty());
    std::vector<CodepointRange> others = EscapedRanges();
    for (const auto& [cp, child] : n.children) {
      if (cp < 0x20 || cp == '"' || cp == '\\') continue;  // names needing escapes: never written raw
      alts.push_back(Seq({Expr::Char(cp), self(self, *child)}));
      others.push_back({cp, cp});
    }
    alts.push_back(Seq({Expr::Class(std::move(others), true), Expr::Star(RawChar())}));
    return Alt(std::move(alts));
  };
  return build(build, root);
}

void AddSharedRules(const Separators& sep, GrammarBuilder* builder) {
  builder->AddRule(kCharRule, StringChar());
  builder->AddRule(kStringRule, Seq({Lit("\""), Expr::Star(Expr::Ref(kCharRule)), Lit("\"")}));
  builder->AddRule(kValueRule, Alt({Expr::Ref(kObjectRule), Expr::Ref(kArrayRule), Expr::Ref(kStringRule), Number(),
                                    Lit("true"), Lit("false"), Lit("null")}));
  const Expr member = Seq({Expr::Ref(kStringRule), Lit(sep.key), Expr::Ref(kValueRule)});
  builder->AddRule(kObjectRule,
                   Seq({Lit("{"), Expr::Optional(Seq({member, Expr::Star(Seq({Lit(sep.item), member}))})), Lit("}")}));
  builder->AddRule(kArrayRule, Seq({Lit("["),
                                    Expr::Optional(Seq({Expr::Ref(kValueRule),
                                                        Expr::Star(Seq({Lit(sep.item), Expr::Ref(kValueRule)}))})),
                                    Lit("]")}));
}

}  // namespace tandem::grammar::json_values
