#include "engine/output_parsing/json_prefix_scanner.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::output_parsing {
namespace {

bool IsJsonWhitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string Describe(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7F) return absl::StrCat("'", std::string(1, c), "'");
  return absl::StrFormat("byte 0x%02X", u);
}

}  // namespace

bool JsonPrefixScanner::Fail(std::string why) {
  failed_ = true;
  error_ = std::move(why);
  return false;
}

JsonPrefixScanner::State JsonPrefixScanner::AfterValue() const {
  return stack_.empty() ? State::kDone : State::kCommaOrEnd;
}

bool JsonPrefixScanner::StartValue(char c) {
  if (!started_) {
    started_ = true;
    first_byte_ = c;
  }
  switch (c) {
    case '{':
      stack_.push_back(Container::kObject);
      state_ = State::kObjectKeyOrEnd;
      return true;
    case '[':
      stack_.push_back(Container::kArray);
      state_ = State::kArrayValueOrEnd;
      return true;
    case '"':
      string_is_key_ = false;
      state_ = State::kString;
      return true;
    case '-':
      state_ = State::kNumberSign;
      return true;
    case '0':
      state_ = State::kNumberZero;
      return true;
    case 't':
      literal_rest_ = "rue";
      state_ = State::kLiteral;
      return true;
    case 'f':
      literal_rest_ = "alse";
      state_ = State::kLiteral;
      return true;
    case 'n':
      literal_rest_ = "ull";
      state_ = State::kLiteral;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        state_ = State::kNumberInt;
        return true;
      }
      return Fail(absl::StrCat(Describe(c), " cannot start a JSON value"));
  }
}

bool JsonPrefixScanner::FeedAfterValue(char c) {
  if (IsJsonWhitespace(c)) return true;
  if (state_ == State::kDone) return Fail(absl::StrCat(Describe(c), " after the end of the JSON value"));
  const Container top = stack_.back();
  if (c == ',') {
    state_ = top == Container::kObject ? State::kObjectKey : State::kValue;
    return true;
  }
  if ((c == '}' && top == Container::kObject) || (c == ']' && top == Container::kArray)) {
    stack_.pop_back();
    state_ = AfterValue();
    return true;
  }
  return Fail(absl::StrCat(Describe(c), " where ',' or '", top == Container::kObject ? "}" : "]",
                           "' was expected"));
}

bool JsonPrefixScanner::EndNumber(char c) {
  state_ = AfterValue();
  return FeedAfterValue(c);
}

bool JsonPrefixScanner::Feed(char c) {
  if (failed_) return false;
  switch (state_) {
    case State::kValue:
      if (IsJsonWhitespace(c)) return true;
      return StartValue(c);
    case State::kArrayValueOrEnd:
      if (IsJsonWhitespace(c)) return true;
      if (c == ']') {
        stack_.pop_back();
        state_ = AfterValue();
        return true;
      }
      return StartValue(c);
    case State::kObjectKeyOrEnd:
      if (IsJsonWhitespace(c)) return true;
      if (c == '}') {
        stack_.pop_back();
        state_ = AfterValue();
        return true;
      }
      [[fallthrough]];
    case State::kObjectKey:
      if (IsJsonWhitespace(c)) return true;
      if (c != '"') return Fail(absl::StrCat(Describe(c), " where an object key was expected"));
      string_is_key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      if (IsJsonWhitespace(c)) return true;
      if (c != ':') return Fail(absl::StrCat(Describe(c), " where ':' was expected"));
      state_ = State::kValue;
      return true;
    case State::kCommaOrEnd:
    case State::kDone:
      return FeedAfterValue(c);
    case State::kString:
      if (c == '"') {
        state_ = string_is_key_ ? State::kColon : AfterValue();
        return true;
      }
      if (c == '\\') {
        state_ = State::kStringEscape;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        return Fail(absl::StrCat("unescaped control character ", Describe(c), " in a string"));
      }
      return true;
    case State::kStringEscape:
      switch (c) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          state_ = State::kString;
          return true;
        case 'u':
          unicode_digits_ = 0;
          state_ = State::kStringUnicode;
          return true;
        default:
          return Fail(absl::StrCat("invalid escape \\", Describe(c), " in a string"));
      }
    case State::kStringUnicode:
      if (!IsHexDigit(c)) return Fail(absl::StrCat(Describe(c), " in a \\u escape"));
      if (++unicode_digits_ == 4) state_ = State::kString;
      return true;
    case State::kNumberSign:
      if (c == '0') {
        state_ = State::kNumberZero;
        return true;
      }
      if (IsDigit(c)) {
        state_ = State::kNumberInt;
        return true;
      }
      return Fail(absl::StrCat(Describe(c), " after '-'"));
    case State::kNumberZero:
    case State::kNumberInt:
      if (IsDigit(c)) {
        if (state_ == State::kNumberZero) return Fail("a number with a leading zero");
        return true;
      }
      if (c == '.') {
        state_ = State::kNumberDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kNumberExp;
        return true;
      }
      return EndNumber(c);
    case State::kNumberDot:
      if (!IsDigit(c)) return Fail(absl::StrCat(Describe(c), " after a decimal point"));
      state_ = State::kNumberFrac;
      return true;
    case State::kNumberFrac:
      if (IsDigit(c)) return true;
      if (c == 'e' || c == 'E') {
        state_ = State::kNumberExp;
        return true;
      }
      return EndNumber(c);
    case State::kNumberExp:
      if (c == '+' || c == '-') {
        state_ = State::kNumberExpSign;
        return true;
      }
      [[fallthrough]];
    case State::kNumberExpSign:
      if (!IsDigit(c)) return Fail(absl::StrCat(Describe(c), " in an exponent"));
      state_ = State::kNumberExpDigits;
      return true;
    case State::kNumberExpDigits:
      if (IsDigit(c)) return true;
      return EndNumber(c);
    case State::kLiteral:
      if (c != literal_rest_.front()) return Fail(absl::StrCat(Describe(c), " in a literal"));
      literal_rest_.remove_prefix(1);
      if (literal_rest_.empty()) state_ = AfterValue();
      return true;
  }
  return Fail("unreachable scanner state");
}

}  // namespace tandem::output_parsing
