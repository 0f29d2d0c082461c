#include "engine/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

enum class Scan { kValid, kInvalid, kIncomplete };

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Looks at the sequence starting at bytes[pos], exactly as Rust's Utf8Chunks does.
// kValid: a complete character of *len bytes. kInvalid: a maximal invalid subsequence of
// *len bytes (to become one U+FFFD). kIncomplete: the *len bytes up to the end are a
// proper prefix of a valid sequence.
Scan ScanOne(std::string_view bytes, size_t pos, size_t* len) {
  const size_t n = bytes.size();
  const uint8_t lead = static_cast<uint8_t>(bytes[pos]);
  if (lead < 0x80) {
    *len = 1;
    return Scan::kValid;
  }
  size_t width = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    width = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    width = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    width = 4;
  } else {
    *len = 1;
    return Scan::kInvalid;
  }
  // The second byte's allowed range depends on the lead byte (no overlongs, no
  // surrogates, nothing above U+10FFFF).
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
  for (size_t k = 1; k < width; ++k) {
    if (pos + k >= n) {
      *len = k;
      return Scan::kIncomplete;
    }
    const uint8_t b = static_cast<uint8_t>(bytes[pos + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : IsContinuation(b);
    if (!ok) {
      *len = k;
      return Scan::kInvalid;
    }
  }
  *len = width;
  return Scan::kValid;
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // Fast path for runs of ASCII.
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    if (ScanOne(bytes, pos, &len) != Scan::kValid) return false;
    pos += len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = Utf8LossyPrefix(bytes, &out);
  if (pos < bytes.size()) out += kReplacementUtf8;  // a truncated sequence at the end
  return out;
}

size_t Utf8LossyPrefix(std::string_view bytes, std::string* out) {
  size_t pos = 0;
  size_t valid_start = 0;  // start of the run of valid bytes not yet appended
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    switch (ScanOne(bytes, pos, &len)) {
      case Scan::kValid:
        pos += len;
        break;
      case Scan::kInvalid:
        out->append(bytes.substr(valid_start, pos - valid_start));
        *out += kReplacementUtf8;
        pos += len;
        valid_start = pos;
        break;
      case Scan::kIncomplete:
        out->append(bytes.substr(valid_start, pos - valid_start));
        return pos;
    }
  }
  out->append(bytes.substr(valid_start, pos - valid_start));
  return pos;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t DecodeUtf8(std::string_view text, size_t* pos) {
  const uint8_t lead = static_cast<uint8_t>(text[*pos]);
  const size_t len = Utf8SequenceLength(lead);
  uint32_t cp = len == 1   ? lead
                : len == 2 ? (lead & 0x1F)
                : len == 3 ? (lead & 0x0F)
                           : (lead & 0x07);
  for (size_t k = 1; k < len; ++k) {
    cp = (cp << 6) | (static_cast<uint8_t>(text[*pos + k]) & 0x3F);
  }
  *pos += len;
  return cp;
}

uint32_t DecodeUtf8Before(std::string_view text, size_t end, size_t* start) {
  size_t s = end - 1;
  while (s > 0 && IsContinuation(static_cast<uint8_t>(text[s]))) --s;
  *start = s;
  size_t pos = s;
  return DecodeUtf8(text, &pos);
}

bool IsUnicodeWhiteSpace(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace tandem::tokenizer_internal
