#include "engine/grammar/utf8_ranges.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"
#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {

constexpr uint32_t kMaxOfLength[] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};

int EncodedLength(uint32_t cp) {
  if (cp <= 0x7F) return 1;
  if (cp <= 0x7FF) return 2;
  if (cp <= 0xFFFF) return 3;
  return 4;
}

void Encode(uint32_t cp, uint8_t out[4]) {
  std::string s;
  AppendCodepointUtf8(cp, &s);
  for (size_t i = 0; i < s.size(); ++i) out[i] = static_cast<uint8_t>(s[i]);
}

// [lo, hi] of one encoded length, split until every byte position varies independently:
// a range whose low end is not at the start of a block of 64^i code points (or whose high
// end is not at its end) is split at that block's boundary.
void AddSameLength(uint32_t lo, uint32_t hi, std::vector<Utf8ByteRanges>* out) {
  const int n = EncodedLength(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        AddSameLength(lo, lo | m, out);
        AddSameLength((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        AddSameLength(lo, (hi & ~m) - 1, out);
        AddSameLength(hi & ~m, hi, out);
        return;
      }
    }
  }
  Utf8ByteRanges r;
  r.length = n;
  Encode(lo, r.lo);
  Encode(hi, r.hi);
  out->push_back(r);
}

}  // namespace

void AppendCodepointUtf8(uint32_t cp, std::string* out) {
  TANDEM_CHECK(cp <= kMaxCodepoint && !(cp >= 0xD800 && cp <= 0xDFFF)) << cp;
  tokenizer_internal::AppendUtf8(cp, out);
}

int32_t DecodeCodepoint(std::string_view text, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(*pos);
  int n = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++*pos;
    return -1;
  }
  if (*pos + n > text.size()) {
    ++*pos;
    return -1;
  }
  for (int i = 1; i < n; ++i) {
    const uint8_t b = byte(*pos + i);
    if ((b & 0xC0) != 0x80) {
      ++*pos;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*pos;
    return -1;
  }
  *pos += n;
  return static_cast<int32_t>(cp);
}

std::vector<Utf8ByteRanges> Utf8Sequences(const std::vector<CodepointRange>& ranges) {
  std::vector<Utf8ByteRanges> out;
  for (const CodepointRange& r : ranges) {
    uint32_t lo = r.lo;
    while (lo <= r.hi) {
      const uint32_t end = std::min(r.hi, kMaxOfLength[EncodedLength(lo)]);
      AddSameLength(lo, end, &out);
      if (end == kMaxCodepoint) break;
      lo = end + 1;
    }
  }
  return out;
}

}  // namespace tandem::grammar
