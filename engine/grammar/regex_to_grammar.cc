#include "engine/grammar/regex_to_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/utf8_ranges.h"

namespace tandem::grammar {
namespace {

constexpr int kMaxGroupNesting = 1000;

std::vector<CodepointRange> DigitRanges() { return {{'0', '9'}}; }
std::vector<CodepointRange> WordRanges() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
std::vector<CodepointRange> SpaceRanges(RegexDialect d) {
  if (d == RegexDialect::kPython) return {{'\t', '\r'}, {' ', ' '}};
  return {{'\t', '\r'}, {' ', ' '},         {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
std::vector<CodepointRange> DotExcluded(RegexDialect d) {
  if (d == RegexDialect::kPython) return {{'\n', '\n'}};
  return {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
}

class RegexParser {
 public:
  RegexParser(std::string_view pattern, const RegexOptions& options) : p_(pattern), options_(options) {}

  absl::StatusOr<Expr> Parse() {
    bool anchored_start = false, anchored_end = false;
    size_t end = p_.size();
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      i_ = 1;
    }
    if (end > i_ && p_[end - 1] == '$' && !Escaped(end - 1)) {
      anchored_end = true;
      --end;
    }
    end_ = end;
    absl::StatusOr<Expr> body = ParseAlternatives(0);
    if (!body.ok()) return body.status();
    if (i_ < end_) {
      if (p_[i_] == ')') return Fail("unbalanced ')'");
      return Fail("unexpected character");
    }
    if (!options_.search) return body;
    std::vector<Expr> seq;
    if (!anchored_start) seq.push_back(Expr::Star(Expr::AnyChar()));
    seq.push_back(*std::move(body));
    if (!anchored_end) seq.push_back(Expr::Star(Expr::AnyChar()));
    return Expr::Sequence(std::move(seq));
  }

 private:
  // Whether p_[k] is preceded by an odd number of backslashes.
  bool Escaped(size_t k) const {
    size_t n = 0;
    while (k > n && p_[k - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  bool AtEnd() const { return i_ >= end_; }
  char Peek(size_t ahead = 0) const { return i_ + ahead < end_ ? p_[i_ + ahead] : '\0'; }

  SourcePos Pos() const {
    SourcePos pos;
    pos.column = static_cast<int>(i_) + 1;
    return pos;
  }

  absl::Status Fail(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", std::string(what), " at offset ", i_));
  }
  absl::Status Unsupported(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", std::string(what), " (at offset ", i_,
                                                   ") is not supported"));
  }

  absl::StatusOr<Expr> ParseAlternatives(int depth) {
    if (depth > kMaxGroupNesting) return Fail(absl::StrCat("groups nested deeper than ", kMaxGroupNesting));
    std::vector<Expr> alts;
    for (;;) {
      absl::StatusOr<Expr> seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      alts.push_back(*std::move(seq));
      if (Peek() != '|' || AtEnd()) break;
      ++i_;
    }
    return Expr::Choice(std::move(alts));
  }

  absl::StatusOr<Expr> ParseSequence(int depth) {
    std::vector<Expr> items;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      absl::StatusOr<Expr> atom = ParseAtom(depth);
      if (!atom.ok()) return atom.status();
      absl::StatusOr<Expr> q = ParseQuantifiers(*std::move(atom));
      if (!q.ok()) return q.status();
      items.push_back(*std::move(q));
    }
    return Expr::Sequence(std::move(items));
  }

  // A {m}, {m,}, {m,n} or {,n} quantifier at i_, or nullopt-like false when the brace
  // is a literal (Python reads a brace that starts no quantifier as itself).
  bool TryBraces(int* min, int* max, size_t* after) const {
    size_t k = i_ + 1;
    const auto number = [&](int* v) {
      const size_t start = k;
      int64_t n = 0;
      while (k < end_ && p_[k] >= '0' && p_[k] <= '9') {
        n = std::min<int64_t>(n * 10 + (p_[k] - '0'), int64_t{kMaxRepetition} + 1);
        ++k;
      }
      *v = static_cast<int>(n);
      return k > start;
    };
    int lo = 0, hi = -1;
    const bool has_lo = number(&lo);
    if (k < end_ && p_[k] == '}') {
      if (!has_lo) return false;
      *min = *max = lo;
      *after = k + 1;
      return true;
    }
    if (k >= end_ || p_[k] != ',') return false;
    ++k;
    const bool has_hi = number(&hi);
    if (k >= end_ || p_[k] != '}') return false;
    *min = has_lo ? lo : 0;
    *max = has_hi ? hi : -1;
    *after = k + 1;
    return true;
  }

  // At most one quantifier (with its lazy mark) after an atom: Python refuses a second
  // one ("multiple repeat").
  absl::StatusOr<Expr> ParseQuantifiers(Expr atom) {
    const SourcePos pos = Pos();
    if (AtEnd()) return atom;
    const char c = Peek();
    int min = 0, max = -1;
    if (c == '*') {
      ++i_;
    } else if (c == '+') {
      ++i_;
      min = 1;
    } else if (c == '?') {
      ++i_;
      max = 1;
    } else if (c == '{') {
      size_t after = 0;
      if (!TryBraces(&min, &max, &after)) return atom;
      if (min > kMaxRepetition || max > kMaxRepetition) {
        return Fail(absl::StrCat("repetition bound above ", kMaxRepetition));
      }
      if (max >= 0 && max < min) return Fail("repetition bounds out of order");
      i_ = after;
    } else {
      return atom;
    }
    if (!AtEnd() && Peek() == '?') {
      ++i_;  // lazy: the same language under full matching
    } else if (!AtEnd() && Peek() == '+') {
      return Unsupported("a possessive quantifier");
    }
    if (!AtEnd()) {
      int a, b;
      size_t after;
      if (Peek() == '*' || Peek() == '+' || Peek() == '?' || (Peek() == '{' && TryBraces(&a, &b, &after))) {
        return Fail("multiple repeat");
      }
    }
    return Expr::Repeat(std::move(atom), min, max, pos);
  }

  absl::StatusOr<Expr> ParseAtom(int depth) {
    const SourcePos pos = Pos();
    const char c = Peek();
    switch (c) {
      case '(': return ParseGroup(depth);
      case '[': return ParseClass();
      case '.':
        ++i_;
        return Expr::Class(DotExcluded(options_.dialect), true, pos);
      case '*': case '+': case '?':
        return Fail("nothing to repeat");
      case '{': {
        int a, b;
        size_t after;
        if (TryBraces(&a, &b, &after)) return Fail("nothing to repeat");
        ++i_;
        return Expr::Char('{', pos);
      }
      case '^': return Unsupported("the anchor '^' anywhere but at the start");
      case '$': return Unsupported("the anchor '$' anywhere but at the end");
      case '\\': {
        ++i_;
        absl::StatusOr<std::vector<CodepointRange>> ranges;
        bool negated = false;
        absl::Status s = ParseEscape(/*in_class=*/false, &ranges, &negated);
        if (!s.ok()) return s;
        return Expr::Class(*std::move(ranges), negated, pos);
      }
      default: {
        size_t k = i_;
        const int32_t cp = DecodeCodepoint(p_.substr(0, end_), &k);
        if (cp < 0) return Fail("invalid UTF-8");
        i_ = k;
        return Expr::Char(static_cast<uint32_t>(cp), pos);
      }
    }
  }

  absl::StatusOr<Expr> ParseGroup(int depth) {
    ++i_;  // (
    if (Peek() == '?') {
      const char k = Peek(1);
      if (k == ':') {
        i_ += 2;
      } else if (k == 'P' && Peek(2) == '<') {
        i_ += 3;
        if (absl::Status s = SkipGroupName(); !s.ok()) return s;
      } else if (k == '<' && Peek(2) != '=' && Peek(2) != '!') {
        i_ += 2;
        if (absl::Status s = SkipGroupName(); !s.ok()) return s;
      } else if (k == '=' || k == '!') {
        return Unsupported("lookahead");
      } else if (k == '<') {
        return Unsupported("lookbehind");
      } else if (k == 'P' && Peek(2) == '=') {
        return Unsupported("a backreference");
      } else if (k == '#') {
        return Unsupported("a comment group");
      } else if (k == '(') {
        return Unsupported("a conditional group");
      } else if (k == '>') {
        return Unsupported("an atomic group");
      } else {
        return Unsupported("an inline flag group");
      }
    }
    absl::StatusOr<Expr> inner = ParseAlternatives(depth + 1);
    if (!inner.ok()) return inner.status();
    if (Peek() != ')' || AtEnd()) return Fail("missing ')'");
    ++i_;
    return inner;
  }

  absl::Status SkipGroupName() {
    const size_t start = i_;
    while (!AtEnd() && Peek() != '>') ++i_;
    if (AtEnd() || i_ == start) return Fail("bad group name");
    ++i_;
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> ReadHex(int digits) {
    uint32_t v = 0;
    for (int n = 0; n < digits; ++n) {
      const char c = Peek();
      int d;
      if (AtEnd()) return Fail("incomplete escape");
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return Fail("incomplete escape");
      v = v * 16 + static_cast<uint32_t>(d);
      ++i_;
    }
    if (v > kMaxCodepoint) return Fail("code point out of range");
    if (v >= 0xD800 && v <= 0xDFFF) return Unsupported("a surrogate code point");
    return v;
  }

  // After a backslash: a class (shorthand) or one code point. In a class, \b is a
  // backspace; outside, it is a word boundary (unsupported).
  absl::Status ParseEscape(bool in_class, absl::StatusOr<std::vector<CodepointRange>>* out, bool* negated) {
    *negated = false;
    if (AtEnd()) return Fail("bad escape (end of pattern)");
    const char e = Peek();
    ++i_;
    const auto one = [&](uint32_t cp) { *out = std::vector<CodepointRange>{{cp, cp}}; };
    switch (e) {
      case 'd': *out = DigitRanges(); return absl::OkStatus();
      case 'D': *out = DigitRanges(); *negated = true; return absl::OkStatus();
      case 'w': *out = WordRanges(); return absl::OkStatus();
      case 'W': *out = WordRanges(); *negated = true; return absl::OkStatus();
      case 's': *out = SpaceRanges(options_.dialect); return absl::OkStatus();
      case 'S': *out = SpaceRanges(options_.dialect); *negated = true; return absl::OkStatus();
      case 'n': one('\n'); return absl::OkStatus();
      case 't': one('\t'); return absl::OkStatus();
      case 'r': one('\r'); return absl::OkStatus();
      case 'f': one('\f'); return absl::OkStatus();
      case 'v': one('\v'); return absl::OkStatus();
      case 'a': one('\a'); return absl::OkStatus();
      case 'b':
        if (in_class) {
          one('\b');
          return absl::OkStatus();
        }
        --i_;
        return Unsupported("the word boundary \\b");
      case '0': {
        // Python: \0 and up to two more octal digits.
        uint32_t v = 0;
        for (int n = 0; n < 2 && Peek() >= '0' && Peek() <= '7' && !AtEnd(); ++n) v = v * 8 + (p_[i_++] - '0');
        one(v);
        return absl::OkStatus();
      }
      case 'x': {
        absl::StatusOr<uint32_t> v = ReadHex(2);
        if (!v.ok()) return v.status();
        one(*v);
        return absl::OkStatus();
      }
      case 'u': {
        absl::StatusOr<uint32_t> v = ReadHex(4);
        if (!v.ok()) return v.status();
        one(*v);
        return absl::OkStatus();
      }
      case 'U': {
        if (options_.dialect != RegexDialect::kPython) break;
        absl::StatusOr<uint32_t> v = ReadHex(8);
        if (!v.ok()) return v.status();
        one(*v);
        return absl::OkStatus();
      }
      default:
        break;
    }
    --i_;
    if (e >= '1' && e <= '9') return Unsupported("a backreference");
    if (e == 'B' || e == 'A' || e == 'Z' || e == 'z' || e == 'G') return Unsupported(absl::StrCat("the anchor \\", std::string(1, e)));
    if (e == 'p' || e == 'P') return Unsupported("a Unicode property class");
    if (e == 'k') return Unsupported("a named backreference");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      return Unsupported(absl::StrCat("the escape \\", std::string(1, e)));
    }
    size_t k = i_;
    const int32_t cp = DecodeCodepoint(p_.substr(0, end_), &k);
    if (cp < 0) return Fail("invalid UTF-8");
    i_ = k;
    one(static_cast<uint32_t>(cp));
    return absl::OkStatus();
  }

  // One class member: a code point (returned in *cp) or a shorthand class (appended to
  // *ranges; *cp is -1 then).
  absl::Status ClassItem(int64_t* cp, std::vector<CodepointRange>* ranges) {
    if (Peek() == '\\') {
      ++i_;
      absl::StatusOr<std::vector<CodepointRange>> r;
      bool negated = false;
      if (absl::Status s = ParseEscape(/*in_class=*/true, &r, &negated); !s.ok()) return s;
      if (!negated && r->size() == 1 && (*r)[0].lo == (*r)[0].hi) {
        *cp = (*r)[0].lo;
        return absl::OkStatus();
      }
      for (const CodepointRange& x : NormalizeClass(*std::move(r), negated)) ranges->push_back(x);
      *cp = -1;
      return absl::OkStatus();
    }
    size_t k = i_;
    const int32_t c = DecodeCodepoint(p_.substr(0, end_), &k);
    if (c < 0) return Fail("invalid UTF-8");
    i_ = k;
    *cp = c;
    return absl::OkStatus();
  }

  absl::StatusOr<Expr> ParseClass() {
    const SourcePos pos = Pos();
    ++i_;  // [
    bool negated = false;
    if (Peek() == '^' && !AtEnd()) {
      negated = true;
      ++i_;
    }
    std::vector<CodepointRange> ranges;
    bool first = true;
    for (;;) {
      if (AtEnd()) return Fail("unterminated character set");
      if (Peek() == ']') {
        if (!(first && options_.dialect == RegexDialect::kPython)) {
          ++i_;
          break;
        }
      }
      if (Peek() == '[' && (Peek(1) == ':' || Peek(1) == '=' || Peek(1) == '.')) {
        return Unsupported("a POSIX class");
      }
      first = false;
      int64_t lo = 0;
      if (absl::Status s = ClassItem(&lo, &ranges); !s.ok()) return s;
      if (lo < 0) continue;
      if (Peek() == '-' && Peek(1) != ']' && i_ + 1 < end_) {
        ++i_;
        int64_t hi = 0;
        if (absl::Status s = ClassItem(&hi, &ranges); !s.ok()) return s;
        if (hi < 0) return Fail("bad character range");
        if (hi < lo) return Fail("bad character range (out of order)");
        ranges.push_back({static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)});
        continue;
      }
      ranges.push_back({static_cast<uint32_t>(lo), static_cast<uint32_t>(lo)});
    }
    return Expr::Class(std::move(ranges), negated, pos);
  }

  std::string_view p_;
  RegexOptions options_;
  size_t i_ = 0;
  size_t end_ = 0;
};

}  // namespace

absl::StatusOr<Expr> RegexToExpr(std::string_view pattern, const RegexOptions& options) {
  return RegexParser(pattern, options).Parse();
}

absl::StatusOr<Grammar> RegexToGrammar(std::string_view pattern, const RegexOptions& options) {
  absl::StatusOr<Expr> body = RegexToExpr(pattern, options);
  if (!body.ok()) return body.status();
  GrammarBuilder builder;
  builder.AddRule("root", *std::move(body));
  return std::move(builder).Build("root");
}

}  // namespace tandem::grammar
