// Code point ranges as UTF-8 byte sequences: the byte-level form of a character class.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/grammar.h"

namespace tandem::grammar {

// One encoded length's worth of a code point range: byte i of the encoding lies in
// [lo[i], hi[i]], independently of the other bytes.
struct Utf8ByteRanges {
  int length = 0;  // 1 to 4
  uint8_t lo[4] = {0, 0, 0, 0};
  uint8_t hi[4] = {0, 0, 0, 0};
};

// The UTF-8 encodings of the code points in `ranges` (sorted, disjoint, no surrogates:
// NormalizeClass's output) as a union of byte-range sequences, each matching exactly the
// encodings of a contiguous code point range.
std::vector<Utf8ByteRanges> Utf8Sequences(const std::vector<CodepointRange>& ranges);

// Appends the UTF-8 encoding of `cp` (a scalar value: not a surrogate, <= U+10FFFF).
void AppendCodepointUtf8(uint32_t cp, std::string* out);

// Decodes one code point of valid or invalid UTF-8 at text[*pos]: a valid sequence gives
// its code point; an invalid byte gives -1 and advances by one byte.
int32_t DecodeCodepoint(std::string_view text, size_t* pos);

}  // namespace tandem::grammar
