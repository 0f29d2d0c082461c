// Text the way Python writes it, for a template interpreter that must give Jinja2's
// bytes: UTF-8 code point handling (Python strings count, index and slice code points),
// str.isspace / str.strip, repr() of strings and floats, and json.dumps' string escaping.
#pragma once

#include "engine/tokenizer/utf8.h"  // AppendUtf8

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::chat_template_internal {

// Code points to UTF-8: the tokenizer's encoder.
using tokenizer_internal::AppendUtf8;

// Decodes the code point at text[*pos] and advances *pos. A byte that does not start a
// valid UTF-8 sequence decodes as itself (0x80-0xFF) and advances by one, so malformed
// text never stalls or reads past the end.
uint32_t NextCodePoint(std::string_view text, size_t* pos);
// Number of code points (Python's len() of the string).
size_t CodePointCount(std::string_view text);
// Byte offsets of every code point start, plus text.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view text);

// Python's str.isspace() for one code point: White_Space plus U+001C..U+001F.
bool PyIsSpace(uint32_t cp);
// str.strip/lstrip/rstrip: `chars` empty-optional strips whitespace (PyIsSpace),
// otherwise the code points it contains.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);

// repr() of a str: single quotes unless the text has ' and no ", Python's escapes for
// the quote, backslash, \n \r \t and non-printable code points (\xNN, \uNNNN, \UNNNNNNNN).
std::string PyReprString(std::string_view s);
// repr() (and str()) of a float: the shortest digits that round-trip, in Python's
// layout ("1.0", "0.0001", "1e-05", "1e+16", "inf", "nan").
std::string PyFloatRepr(double v);
// json.dumps' encoding of a str, quotes included: ensure_ascii escapes every non-ASCII
// code point as \uXXXX (surrogate pairs above U+FFFF), lower-case hex as Python writes.
void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out);

// str.upper() / str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
// (other scripts are left as they are; Greek's final-sigma rule is not applied).
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
// Whether a code point is a cased letter of those scripts, upper or lower case.
bool IsCasedLetter(uint32_t cp);
bool IsUpperLetter(uint32_t cp);
bool IsLowerLetter(uint32_t cp);
// One code point's case mapping (ß upper-cases to "SS", as Python does).
void AppendUpper(uint32_t cp, std::string* out);
uint32_t ToLower(uint32_t cp);


}  // namespace tandem::chat_template_internal
