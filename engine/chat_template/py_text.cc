#include "engine/chat_template/py_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::chat_template_internal {
namespace {

// Code points Python's str.isprintable() rejects: the controls, format characters,
// separators other than the space, surrogates, private use, and the unassigned ranges
// that matter in practice (the noncharacters and the planes without assignments). Not
// the full Unicode table: other unassigned code points count as printable here.
struct Range {
  uint32_t lo, hi;
};
constexpr Range kNonPrintable[] = {
    {0x0000, 0x001F},    {0x007F, 0x00A0},   {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},
    {0x06DD, 0x06DD},    {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x1680, 0x1680},
    {0x180E, 0x180E},    {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x206F},   {0x3000, 0x3000},
    {0xD800, 0xF8FF},    {0xFEFF, 0xFEFF},   {0xFFF0, 0xFFFB},   {0xFFFE, 0xFFFF},   {0x110BD, 0x110BD},
    {0x110CD, 0x110CD},  {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0x323B0, 0xE00FF},
    {0xE01F0, 0x10FFFF},
};

bool PyIsPrintable(uint32_t cp) {
  for (const Range& r : kNonPrintable) {
    if (cp < r.lo) return true;
    if (cp <= r.hi) return false;
  }
  return true;
}

void AppendHex(uint32_t v, int digits, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = digits - 1; i >= 0; --i) out->push_back(kHex[(v >> (4 * i)) & 0xF]);
}

bool InStripSet(uint32_t cp, const std::optional<std::string>& chars) {
  if (!chars) return PyIsSpace(cp);
  size_t pos = 0;
  while (pos < chars->size()) {
    if (NextCodePoint(*chars, &pos) == cp) return true;
  }
  return false;
}

}  // namespace

uint32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(*pos);
  size_t len = 1;
  uint32_t cp = lead;
  if (lead >= 0xC2 && lead < 0xE0) {
    len = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead < 0xF0) {
    len = 3;
    cp = lead & 0x0F;
  } else if (lead >= 0xF0 && lead < 0xF5) {
    len = 4;
    cp = lead & 0x07;
  }
  if (len == 1 || *pos + len > text.size()) {
    *pos += 1;
    return lead;
  }
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(*pos + i);
    if ((b & 0xC0) != 0x80) {
      *pos += 1;
      return lead;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *pos += len;
  return cp;
}

size_t CodePointCount(std::string_view text) {
  size_t n = 0;
  for (size_t pos = 0; pos < text.size(); ++n) NextCodePoint(text, &pos);
  return n;
}

std::vector<size_t> CodePointOffsets(std::string_view text) {
  std::vector<size_t> offsets;
  offsets.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    offsets.push_back(pos);
    NextCodePoint(text, &pos);
  }
  offsets.push_back(text.size());
  return offsets;
}

bool PyIsSpace(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!InStripSet(NextCodePoint(s, &next), chars)) break;
      begin = next;
    }
  }
  if (right) {
    // Walk forward, remembering where the trailing run of strippable code points starts.
    size_t pos = begin, run = end;
    bool in_run = false;
    while (pos < end) {
      const size_t at = pos;
      const bool strip = InStripSet(NextCodePoint(s, &pos), chars);
      if (strip && !in_run) run = at;
      in_run = strip;
    }
    if (in_run) end = run;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string PyReprString(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (PyIsPrintable(cp)) {
      AppendUtf8(cp, &out);
    } else if (cp < 0x100) {
      out += "\\x";
      AppendHex(cp, 2, &out);
    } else if (cp < 0x10000) {
      out += "\\u";
      AppendHex(cp, 4, &out);
    } else {
      out += "\\U";
      AppendHex(cp, 8, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string PyFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string_view sci(buf, r.ptr - buf);  // "-d.ddde+XX"
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k) {
    if (sci[k] != '.') digits.push_back(sci[k]);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  const int decpt = exponent + 1;  // position of the decimal point after the first digit
  const int n = static_cast<int>(digits.size());
  if (decpt > 16 || decpt <= -4) {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out.append(digits, 0, decpt);
    out.push_back('.');
    out.append(digits, decpt, std::string::npos);
  }
  return out;
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(s, &pos);
    switch (cp) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      *out += "\\u";
      AppendHex(cp, 4, out);
    } else if (cp < 0x80 || !ensure_ascii) {
      out->append(s.substr(start, pos - start));
    } else if (cp < 0x10000) {
      *out += "\\u";
      AppendHex(cp, 4, out);
    } else {
      const uint32_t v = cp - 0x10000;
      *out += "\\u";
      AppendHex(0xD800 | (v >> 10), 4, out);
      *out += "\\u";
      AppendHex(0xDC00 | (v & 0x3FF), 4, out);
    }
  }
  out->push_back('"');
}

namespace {

// The lower-case partner of an upper-case letter, or 0.
uint32_t LowerOf(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x130) return 'i';   // İ
    if (cp == 0x178) return 0xFF;  // Ÿ
    const bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (cp == 0x131 || cp == 0x138 || cp == 0x149 || cp == 0x17F) return 0;
    if (odd_upper) return (cp & 1) ? cp + 1 : 0;
    return (cp & 1) ? 0 : cp + 1;
  }
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF)) return (cp & 1) ? 0 : cp + 1;
  return 0;
}

// The upper-case partner of a lower-case letter, or 0.
uint32_t UpperOf(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp == 0xB5) return 0x39C;  // µ
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x131) return 'I';  // ı
    if (cp == 0x17F) return 'S';  // ſ
    if (cp == 0x130 || cp == 0x138 || cp == 0x149 || cp == 0x178) return 0;
    const bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper) return (cp & 1) ? 0 : cp - 1;
    return (cp & 1) ? cp - 1 : 0;
  }
  if (cp >= 0x3B1 && cp <= 0x3C9) return cp == 0x3C2 ? 0x3A3 : cp - 32;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF)) return (cp & 1) ? cp - 1 : 0;
  return 0;
}

}  // namespace

bool IsUpperLetter(uint32_t cp) { return LowerOf(cp) != 0 || cp == 0x130; }
bool IsLowerLetter(uint32_t cp) { return UpperOf(cp) != 0 || cp == 0xDF || cp == 0x138 || cp == 0x149; }
bool IsCasedLetter(uint32_t cp) { return IsUpperLetter(cp) || IsLowerLetter(cp); }

void AppendUpper(uint32_t cp, std::string* out) {
  if (cp == 0xDF) {  // ß
    *out += "SS";
    return;
  }
  const uint32_t u = UpperOf(cp);
  AppendUtf8(u != 0 ? u : cp, out);
}

uint32_t ToLower(uint32_t cp) {
  const uint32_t l = LowerOf(cp);
  return l != 0 ? l : cp;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) AppendUpper(NextCodePoint(s, &pos), &out);
  return out;
}

std::string PyLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) AppendUtf8(ToLower(NextCodePoint(s, &pos)), &out);
  return out;
}

}  // namespace tandem::chat_template_internal
