#include "engine/grammar/ebnf_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/utf8_ranges.h"

namespace tandem::grammar {
namespace {

constexpr int kMaxGroupNesting = 1000;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

class EbnfParser {
 public:
  EbnfParser(std::string_view text, const EbnfOptions& options) : text_(text), options_(options) {}

  absl::Status Parse(GrammarBuilder* builder) {
    SkipSpace();
    while (!AtEnd()) {
      const SourcePos pos = Pos();
      std::string name = ReadName();
      if (name.empty()) return Fail("expected a rule name");
      SkipSpace();
      if (!Consume("::=")) return Fail(absl::StrCat("expected '::=' after rule name '", name, "'"));
      SkipSpace();
      absl::StatusOr<Expr> body = ParseAlternatives(0);
      if (!body.ok()) return body.status();
      if (builder->HasRule(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("ebnf: ", pos.ToString(), ": rule '", name, "' is defined twice"));
      }
      builder->AddRule(std::move(name), *std::move(body), pos);
      SkipSpace();
    }
    return absl::OkStatus();
  }

 private:
  bool AtEnd() const { return i_ >= text_.size(); }
  char Peek(size_t ahead = 0) const { return i_ + ahead < text_.size() ? text_[i_ + ahead] : '\0'; }

  SourcePos Pos() const {
    SourcePos p;
    p.line = line_;
    p.column = static_cast<int>(i_ - line_start_) + 1;
    return p;
  }

  absl::Status Fail(std::string_view what) const { return FailAt(Pos(), what); }
  static absl::Status FailAt(const SourcePos& pos, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("ebnf: ", pos.ToString(), ": ", std::string(what)));
  }

  void Advance() {
    if (text_[i_] == '\n') {
      ++line_;
      line_start_ = i_ + 1;
    }
    ++i_;
  }

  bool Consume(std::string_view s) {
    if (text_.substr(i_, s.size()) != s) return false;
    for (size_t k = 0; k < s.size(); ++k) Advance();
    return true;
  }

  // Whitespace (newlines included) and comments.
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        Advance();
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') Advance();
      } else {
        break;
      }
    }
  }

  std::string ReadName() {
    std::string name;
    while (!AtEnd() && IsNameChar(Peek())) {
      name.push_back(Peek());
      Advance();
    }
    return name;
  }

  // Whether a rule definition (`name ::=`) starts here: the end of the current body.
  bool AtRuleStart() const {
    size_t k = i_;
    while (k < text_.size() && IsNameChar(text_[k])) ++k;
    if (k == i_) return false;
    for (;;) {
      while (k < text_.size() && (text_[k] == ' ' || text_[k] == '\t' || text_[k] == '\r' || text_[k] == '\n')) ++k;
      if (k < text_.size() && text_[k] == '#') {
        while (k < text_.size() && text_[k] != '\n') ++k;
        continue;
      }
      break;
    }
    return text_.substr(k, 3) == "::=";
  }

  absl::StatusOr<Expr> ParseAlternatives(int depth) {
    if (depth > kMaxGroupNesting) return Fail(absl::StrCat("groups nested deeper than ", kMaxGroupNesting));
    const SourcePos pos = Pos();
    std::vector<Expr> alts;
    for (;;) {
      absl::StatusOr<Expr> seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      alts.push_back(*std::move(seq));
      SkipSpace();
      if (Peek() != '|') break;
      Advance();
      SkipSpace();
    }
    return Expr::Choice(std::move(alts), pos);
  }

  absl::StatusOr<Expr> ParseSequence(int depth) {
    const SourcePos pos = Pos();
    std::vector<Expr> items;
    for (;;) {
      SkipSpace();
      if (AtEnd()) break;
      const char c = Peek();
      if (c == '|' || c == ')') break;
      if (IsNameChar(c) && AtRuleStart()) break;
      absl::StatusOr<Expr> item = ParsePrimary(depth);
      if (!item.ok()) return item.status();
      absl::StatusOr<Expr> repeated = ParsePostfix(*std::move(item));
      if (!repeated.ok()) return repeated.status();
      items.push_back(*std::move(repeated));
    }
    return Expr::Sequence(std::move(items), pos);
  }

  absl::StatusOr<Expr> ParsePrimary(int depth) {
    const SourcePos pos = Pos();
    const char c = Peek();
    if (c == '"') return ParseLiteral();
    if (c == '[') return ParseClass();
    if (c == '<') return ParseTokenName();
    if (c == '@' && Peek(1) == '"') {
      Advance();
      absl::StatusOr<Expr> name = ParseLiteral();
      if (!name.ok()) return name.status();
      if (name->text.empty()) return FailAt(pos, "a token's name is empty");
      return Expr::Token(name->text, pos);
    }
    if (c == '.') {
      Advance();
      return Expr::AnyChar(pos);
    }
    if (c == '(') {
      Advance();
      SkipSpace();
      absl::StatusOr<Expr> inner = ParseAlternatives(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipSpace();
      if (Peek() != ')') return Fail("expected ')'");
      Advance();
      return inner;
    }
    if (IsNameChar(c)) return Expr::Ref(ReadName(), pos);
    return Fail(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::StatusOr<int> ReadInt() {
    if (!(Peek() >= '0' && Peek() <= '9')) return Fail("expected a number");
    int64_t v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxRepetition) return Fail(absl::StrCat("repetition bound above ", kMaxRepetition));
      Advance();
    }
    return static_cast<int>(v);
  }

  absl::StatusOr<Expr> ParsePostfix(Expr item) {
    for (;;) {
      const SourcePos pos = Pos();
      const char c = Peek();
      if (c == '*') {
        Advance();
        item = Expr::Star(std::move(item), pos);
      } else if (c == '+') {
        Advance();
        item = Expr::Plus(std::move(item), pos);
      } else if (c == '?') {
        Advance();
        item = Expr::Optional(std::move(item), pos);
      } else if (c == '{') {
        Advance();
        SkipSpace();
        int min = 0, max = -1;
        if (Peek() != ',') {
          absl::StatusOr<int> m = ReadInt();
          if (!m.ok()) return m.status();
          min = max = *m;
        }
        SkipSpace();
        if (Peek() == ',') {
          Advance();
          SkipSpace();
          max = -1;
          if (Peek() != '}') {
            absl::StatusOr<int> m = ReadInt();
            if (!m.ok()) return m.status();
            max = *m;
          }
        }
        SkipSpace();
        if (Peek() != '}') return Fail("expected '}' closing a repetition");
        Advance();
        if (max >= 0 && max < min) return Fail(absl::StrCat("repetition {", min, ",", max, "} is out of order"));
        item = Expr::Repeat(std::move(item), min, max, pos);
      } else {
        return item;
      }
    }
  }

  // One character of a literal or class (after a backslash when escaped).
  absl::StatusOr<uint32_t> ReadChar() {
    if (AtEnd()) return Fail("unterminated literal or class");
    if (Peek() != '\\') {
      size_t p = i_;
      const int32_t cp = DecodeCodepoint(text_, &p);
      if (cp < 0) return Fail("invalid UTF-8");
      while (i_ < p) Advance();
      return static_cast<uint32_t>(cp);
    }
    Advance();
    if (AtEnd()) return Fail("unterminated escape");
    const char e = Peek();
    Advance();
    switch (e) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^':
        return static_cast<uint32_t>(e);
      case 'x': return ReadHex(2);
      case 'u': return ReadHex(4);
      case 'U': return ReadHex(8);
      default:
        return Fail(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
    }
  }

  absl::StatusOr<uint32_t> ReadHex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = Peek();
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return Fail(absl::StrCat("expected ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      Advance();
    }
    if (v > kMaxCodepoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return Fail(absl::StrCat("code point 0x", absl::Hex(v), " is not a Unicode scalar value"));
    }
    return v;
  }

  absl::StatusOr<Expr> ParseLiteral() {
    const SourcePos pos = Pos();
    Advance();  // "
    std::string bytes;
    for (;;) {
      if (AtEnd() || Peek() == '\n') return FailAt(pos, "unterminated literal");
      if (Peek() == '"') {
        Advance();
        break;
      }
      absl::StatusOr<uint32_t> c = ReadChar();
      if (!c.ok()) return c.status();
      AppendCodepointUtf8(*c, &bytes);
    }
    return Expr::Literal(bytes, pos);
  }

  // <...>: the token whose content is the text from '<' to the first '>', both included;
  // <[N]>: the token of id N.
  absl::StatusOr<Expr> ParseTokenName() {
    const SourcePos pos = Pos();
    const size_t start = i_;
    if (Peek(1) == '[') return ParseTokenId(pos);
    for (;;) {
      if (AtEnd() || Peek() == '\n' || Peek() == ' ' || Peek() == '\t' || Peek() == '\r' || Peek() == '"') {
        return FailAt(pos, "unterminated token name (<...> without whitespace or quotes; @\"...\" for others)");
      }
      const char c = Peek();
      Advance();
      if (c == '>' && i_ - start > 2) break;
      if (c == '>') return FailAt(pos, "a token's name is empty");
    }
    return Expr::Token(text_.substr(start, i_ - start), pos);
  }

  absl::StatusOr<Expr> ParseTokenId(const SourcePos& pos) {
    Advance();  // <
    Advance();  // [
    int64_t id = 0;
    int digits = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      if (++digits > 10) return FailAt(pos, "a token id has more than 10 digits");
      id = id * 10 + (Peek() - '0');
      Advance();
    }
    if (digits == 0 || AtEnd() || Peek() != ']' || Peek(1) != '>') {
      return FailAt(pos, "expected a token id as <[N]>, N decimal digits");
    }
    Advance();  // ]
    Advance();  // >
    if (!options_.token_by_id) return FailAt(pos, "token ids (<[N]>) need the model's vocabulary");
    absl::StatusOr<std::string> content = options_.token_by_id(id);
    if (!content.ok()) return FailAt(pos, std::string(content.status().message()));
    return Expr::Token(*content, pos);
  }

  absl::StatusOr<Expr> ParseClass() {
    const SourcePos pos = Pos();
    Advance();  // [
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      Advance();
    }
    std::vector<CodepointRange> ranges;
    for (;;) {
      if (AtEnd() || Peek() == '\n') return FailAt(pos, "unterminated class");
      if (Peek() == ']') {
        Advance();
        break;
      }
      absl::StatusOr<uint32_t> lo = ReadChar();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (Peek() == '-' && Peek(1) != ']') {
        Advance();
        absl::StatusOr<uint32_t> h = ReadChar();
        if (!h.ok()) return h.status();
        if (*h < *lo) return Fail("class range out of order");
        hi = *h;
      }
      ranges.push_back({*lo, hi});
    }
    return Expr::Class(std::move(ranges), negated, pos);
  }

  std::string_view text_;
  const EbnfOptions& options_;
  size_t i_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
};

}  // namespace

absl::Status ParseEbnfRules(std::string_view text, GrammarBuilder* builder, const EbnfOptions& options) {
  EbnfParser parser(text, options);
  return parser.Parse(builder);
}

absl::StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root, const EbnfOptions& options) {
  GrammarBuilder builder;
  if (absl::Status s = ParseEbnfRules(text, &builder, options); !s.ok()) return s;
  return std::move(builder).Build(root);
}

}  // namespace tandem::grammar
