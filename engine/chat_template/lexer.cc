#include "engine/chat_template/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/chat_template/py_text.h"

namespace tandem::chat_template_internal {
namespace {

enum class TagKind { kVariable, kBlock, kComment };

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's str.rstrip() (Unicode whitespace).
std::string_view RStrip(std::string_view s) {
  size_t end = s.size(), pos = 0, run = s.size();
  bool in_run = false;
  while (pos < end) {
    const size_t at = pos;
    const bool space = PyIsSpace(NextCodePoint(s, &pos));
    if (space && !in_run) run = at;
    in_run = space;
  }
  return in_run ? s.substr(0, run) : s;
}

bool AllSpace(std::string_view s) {
  if (s.empty()) return false;
  for (size_t pos = 0; pos < s.size();) {
    if (!PyIsSpace(NextCodePoint(s, &pos))) return false;
  }
  return true;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start;
      TagKind kind;
      if (!FindTag(pos_, &start, &kind)) {
        Emit(TokenType::kText, std::string(src_.substr(pos_)), pos_);
        break;
      }
      std::string_view text = src_.substr(pos_, start - pos_);
      size_t after = start + 2;
      const char ctrl = after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      if (ctrl == '-') {
        text = RStrip(text);
      } else if (ctrl != '+' && kind != TagKind::kVariable) {
        // lstrip_blocks: drop the indentation between the line's start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && AllSpace(text.substr(l_pos))) text = text.substr(0, l_pos);
      }
      if (!text.empty()) Emit(TokenType::kText, std::string(text), pos_);
      if (ctrl != 0) ++after;
      pos_ = after;
      absl::Status s = kind == TagKind::kComment ? SkipComment(start) : LexTag(kind, start);
      if (!s.ok()) return s;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    Emit(TokenType::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  bool FindTag(size_t from, size_t* start, TagKind* kind) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1)) {
      if (p + 1 >= src_.size()) return false;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') {
        *start = p;
        *kind = c == '{' ? TagKind::kVariable : (c == '%' ? TagKind::kBlock : TagKind::kComment);
        return true;
      }
    }
    return false;
  }

  absl::Status Error(size_t at, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Position(src_, at), ": ", std::string(what)));
  }

  void Emit(TokenType type, std::string value, size_t offset) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.offset = offset;
    tokens_.push_back(std::move(t));
  }

  void SkipWhitespace() {
    while (pos_ < src_.size()) {
      size_t next = pos_;
      if (!PyIsSpace(NextCodePoint(src_, &next))) break;
      pos_ = next;
    }
  }

  bool At(std::string_view s) const { return src_.compare(pos_, s.size(), s) == 0; }

  absl::Status SkipComment(size_t start) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) return Error(start, "missing end of comment tag");
    const char before = end > pos_ ? src_[end - 1] : 0;
    pos_ = end + 2;
    if (before == '-') {
      SkipWhitespace();
    } else if (before != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;  // trim_blocks
    }
    return absl::OkStatus();
  }

  // Consumes the end of the tag at pos_ when there is one (and no bracket is open).
  bool TryTagEnd(TagKind kind) {
    if (!brackets_.empty()) return false;
    const size_t at = pos_;
    if (kind == TagKind::kBlock) {
      if (At("+%}")) {
        pos_ += 3;
      } else if (At("-%}")) {
        pos_ += 3;
        SkipWhitespace();
      } else if (At("%}")) {
        pos_ += 2;
        if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;  // trim_blocks
      } else {
        return false;
      }
      Emit(TokenType::kBlockEnd, "", at);
      return true;
    }
    if (At("-}}")) {
      pos_ += 3;
      SkipWhitespace();
    } else if (At("}}")) {
      pos_ += 2;
    } else {
      return false;
    }
    Emit(TokenType::kVarEnd, "", at);
    return true;
  }

  absl::Status LexTag(TagKind kind, size_t start) {
    Emit(kind == TagKind::kBlock ? TokenType::kBlockBegin : TokenType::kVarBegin, "", start);
    while (true) {
      SkipWhitespace();
      if (pos_ >= src_.size()) {
        return Error(start, kind == TagKind::kBlock ? "unexpected end of template: '{%' is never closed"
                                                    : "unexpected end of template: '{{' is never closed");
      }
      if (TryTagEnd(kind)) return absl::OkStatus();
      const char c = src_[pos_];
      absl::Status s = absl::OkStatus();
      if (IsNameStart(c)) {
        const size_t at = pos_;
        while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
        Emit(TokenType::kName, std::string(src_.substr(at, pos_ - at)), at);
      } else if (IsDigit(c)) {
        s = LexNumber();
      } else if (c == '\'' || c == '"') {
        s = LexString();
      } else {
        s = LexOperator();
      }
      if (!s.ok()) return s;
    }
  }

  absl::Status LexNumber() {
    const size_t at = pos_;
    auto digits = [&](bool (*ok)(char)) {
      const size_t from = pos_;
      while (pos_ < src_.size() && (ok(src_[pos_]) || (src_[pos_] == '_' && pos_ > from))) ++pos_;
      return pos_ > from;
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() &&
        std::string_view("xXoObB").find(src_[pos_ + 1]) != std::string_view::npos) {
      const char p = static_cast<char>(src_[pos_ + 1] | 0x20);
      const int base = p == 'x' ? 16 : (p == 'o' ? 8 : 2);
      pos_ += 2;
      const size_t from = pos_;
      while (pos_ < src_.size() && (HexDigit(src_[pos_]) >= 0 || src_[pos_] == '_')) ++pos_;
      std::string body;
      for (size_t i = from; i < pos_; ++i) {
        if (src_[i] != '_') body.push_back(src_[i]);
      }
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(body.c_str(), &end, base);
      if (body.empty() || *end != 0 || errno != 0) return Error(at, "invalid integer literal");
      Emit(TokenType::kInteger, "", at);
      tokens_.back().int_value = v;
      return absl::OkStatus();
    }
    digits(IsDigit);
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
      ++pos_;
      digits(IsDigit);
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        pos_ = p;
        digits(IsDigit);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = at; i < pos_; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    if (is_float) {
      Emit(TokenType::kFloat, "", at);
      tokens_.back().float_value = std::strtod(text.c_str(), nullptr);
      return absl::OkStatus();
    }
    errno = 0;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno != 0) return Error(at, "integer literal out of range (only 64-bit integers are supported)");
    Emit(TokenType::kInteger, "", at);
    tokens_.back().int_value = v;
    return absl::OkStatus();
  }

  // A string literal, its escapes decoded as Python's unicode-escape codec does.
  absl::Status LexString() {
    const size_t at = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) return Error(at, "unexpected char: unterminated string literal");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) return Error(at, "unexpected char: unterminated string literal");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t cp = 0;
          for (int i = 0; i < n; ++i) {
            const int d = pos_ < src_.size() ? HexDigit(src_[pos_]) : -1;
            if (d < 0) return Error(at, absl::StrCat("truncated \\", std::string(1, e), " escape"));
            cp = cp * 16 + static_cast<uint32_t>(d);
            ++pos_;
          }
          if (cp > 0x10FFFF) return Error(at, "illegal Unicode character");
          AppendUtf8(cp, &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            }
            AppendUtf8(cp, &out);
          } else if (e == 'N') {
            return Error(at, "\\N{...} escapes are not supported");
          } else {
            out.push_back('\\');  // unknown escapes stay as written
            out.push_back(e);
          }
      }
    }
    Emit(TokenType::kString, std::move(out), at);
    return absl::OkStatus();
  }

  absl::Status LexOperator() {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    const size_t at = pos_;
    for (std::string_view op : kTwo) {
      if (At(op)) {
        pos_ += 2;
        Emit(TokenType::kOp, std::string(op), at);
        return absl::OkStatus();
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos) {
      size_t next = pos_;
      std::string ch;
      AppendUtf8(NextCodePoint(src_, &next), &ch);
      return Error(at, absl::StrCat("unexpected char '", ch, "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets_.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets_.empty()) return Error(at, absl::StrCat("unexpected '", std::string(1, c), "'"));
      if (brackets_.back() != c) {
        return Error(at, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                      std::string(1, brackets_.back()), "'"));
      }
      brackets_.pop_back();
    }
    ++pos_;
    Emit(TokenType::kOp, std::string(1, c), at);
    return absl::OkStatus();
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::vector<char> brackets_;
  std::vector<Token> tokens_;
};

}  // namespace

std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view normalized) { return Lexer(normalized).Run(); }

std::string Position(std::string_view normalized, size_t offset) {
  if (offset > normalized.size()) offset = normalized.size();
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (normalized[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  const size_t column = CodePointCount(normalized.substr(line_start, offset - line_start)) + 1;
  return absl::StrCat("line ", line, ", column ", column);
}

}  // namespace tandem::chat_template_internal
