// JsonPrefixScanner: reads one JSON value (RFC 8259) a byte at a time and says, after
// each byte, whether the bytes so far can still begin a valid value and whether a whole
// value has been read. Tool-call parsers use it to stream argument text while it is
// still JSON, to see where the arguments end without waiting for a closing marker, and
// to reject malformed arguments at the first byte that makes them so.
//
// Bytes of 0x80 and above are accepted inside strings as they are: the text comes from
// the detokenizer, which emits valid UTF-8 only. A value that is a bare number is never
// complete (its end is only known at the byte after it); callers that need one should
// require an object or an array, as tool arguments are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::output_parsing {

class JsonPrefixScanner {
 public:
  // Feeds the next byte. Returns false, and stays failed, when the bytes read so far can
  // no longer begin a JSON value, or when a byte other than whitespace follows a
  // complete value.
  bool Feed(char c);

  bool failed() const { return failed_; }
  // A byte other than leading whitespace has been accepted.
  bool started() const { return started_; }
  // A whole value has been read (only whitespace may follow).
  bool complete() const { return state_ == State::kDone; }
  // The first byte of the value ('{' for an object), or 0 before it.
  char first_byte() const { return first_byte_; }
  // Why Feed returned false; empty while not failed.
  const std::string& error() const { return error_; }

 private:
  enum class State : uint8_t {
    kValue,             // a value must start here (whitespace allowed)
    kArrayValueOrEnd,   // after '[': a value or ']'
    kObjectKeyOrEnd,    // after '{': a key or '}'
    kObjectKey,         // after ',' in an object: a key
    kColon,             // after a key: ':'
    kCommaOrEnd,        // after a value inside a container: ',' or the closing bracket
    kString,            // inside a string
    kStringEscape,      // after '\' in a string
    kStringUnicode,     // inside \uXXXX (unicode_digits_ hex digits read)
    kNumberSign,        // after '-'
    kNumberZero,        // after a leading 0
    kNumberInt,         // in the integer digits (not a leading 0)
    kNumberDot,         // after '.'
    kNumberFrac,        // in the fraction digits
    kNumberExp,         // after 'e' or 'E'
    kNumberExpSign,     // after the exponent's sign
    kNumberExpDigits,   // in the exponent digits
    kLiteral,           // inside true / false / null
    kDone,              // a whole value has been read
  };
  enum class Container : uint8_t { kArray, kObject };

  bool Fail(std::string why);
  // The state after a value ends: kCommaOrEnd inside a container, kDone at the top.
  State AfterValue() const;
  // Starts a value at `c` (not whitespace), from kValue or kArrayValueOrEnd.
  bool StartValue(char c);
  // Handles `c` in an after-value position (kCommaOrEnd or kDone).
  bool FeedAfterValue(char c);
  // Ends a number at `c`, the first byte after it, and handles `c`.
  bool EndNumber(char c);

  State state_ = State::kValue;
  std::vector<Container> stack_;
  bool string_is_key_ = false;
  int unicode_digits_ = 0;
  std::string_view literal_rest_;  // the bytes of the literal still expected
  bool started_ = false;
  bool failed_ = false;
  char first_byte_ = 0;
  std::string error_;
};

}  // namespace tandem::output_parsing
