// UTF-8 helpers for the tokenizer: validation, Rust's String::from_utf8_lossy (each
// maximal invalid subsequence becomes one U+FFFD), its streaming form, and code point
// iteration over text already known to be valid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

inline constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";  // U+FFFD

bool IsValidUtf8(std::string_view bytes);

// `bytes` with every maximal invalid subsequence (the "maximal subpart" practice of the
// Unicode standard, as Rust's String::from_utf8_lossy applies it) replaced by U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Streaming form of Utf8Lossy: appends to `out` the conversion of the longest prefix of
// `bytes` whose conversion cannot change whatever bytes follow, and returns its length.
// The bytes left over are a proper prefix of a valid UTF-8 sequence. Utf8Lossy of the
// left-over bytes at the end of the stream completes the conversion.
size_t Utf8LossyPrefix(std::string_view bytes, std::string* out);

// Appends the UTF-8 encoding of code point `cp` (which must be a scalar value).
void AppendUtf8(uint32_t cp, std::string* out);

// Number of bytes of the UTF-8 sequence that starts with `lead` in valid UTF-8.
inline size_t Utf8SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Decodes the code point starting at `text[*pos]` of valid UTF-8 and advances *pos.
uint32_t DecodeUtf8(std::string_view text, size_t* pos);

// Decodes the code point that ends at `text[end - 1]` of valid UTF-8; *start receives
// its first byte's offset.
uint32_t DecodeUtf8Before(std::string_view text, size_t end, size_t* start);

// Unicode White_Space (what Rust's char::is_whitespace and regex `\s` match).
bool IsUnicodeWhiteSpace(uint32_t cp);

}  // namespace tandem::tokenizer_internal
