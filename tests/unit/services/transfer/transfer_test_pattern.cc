#include "tests/unit/services/transfer/transfer_test_pattern.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem::transfer::testing {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>(SplitMix(seed * 0x100000001b3ull + (offset >> 3)) >>
                              (8 * (offset & 7)));
}

void FillPattern(uint64_t seed, uint64_t dest_offset, void* out, size_t length) {
  auto* p = static_cast<uint8_t*>(out);
  size_t i = 0;
  while (i < length && ((dest_offset + i) & 7) != 0) {
    p[i] = PatternByte(seed, dest_offset + i);
    ++i;
  }
  for (; i + 8 <= length; i += 8) {
    const uint64_t word = SplitMix(seed * 0x100000001b3ull + ((dest_offset + i) >> 3));
    std::memcpy(p + i, &word, 8);  // little-endian: byte k is bits 8k..8k+7
  }
  for (; i < length; ++i) p[i] = PatternByte(seed, dest_offset + i);
}

std::string VerifyPattern(const void* buffer, size_t size, uint64_t seed,
                          const std::vector<Range>& ranges) {
  std::vector<Range> sorted = ranges;
  std::sort(sorted.begin(), sorted.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  // Merge overlapping ranges into disjoint covered intervals.
  std::vector<Range> covered;
  for (const Range& r : sorted) {
    if (r.length == 0) continue;
    if (r.offset + r.length > size) return absl::StrCat("range beyond the buffer at ", r.offset);
    if (!covered.empty() && r.offset <= covered.back().offset + covered.back().length) {
      const uint64_t end = std::max(covered.back().offset + covered.back().length,
                                    r.offset + r.length);
      covered.back().length = end - covered.back().offset;
    } else {
      covered.push_back(r);
    }
  }
  const auto* p = static_cast<const uint8_t*>(buffer);
  std::vector<uint8_t> expected;
  uint64_t pos = 0;
  auto check_zero = [&](uint64_t from, uint64_t to) -> std::string {
    for (uint64_t o = from; o < to; ++o) {
      if (p[o] != 0) return absl::StrCat("byte ", o, " outside every put is ", int{p[o]});
    }
    return "";
  };
  for (const Range& r : covered) {
    if (std::string e = check_zero(pos, r.offset); !e.empty()) return e;
    expected.resize(r.length);
    FillPattern(seed, r.offset, expected.data(), r.length);
    if (std::memcmp(p + r.offset, expected.data(), r.length) != 0) {
      for (uint64_t k = 0; k < r.length; ++k) {
        if (p[r.offset + k] != expected[k]) {
          return absl::StrCat("byte ", r.offset + k, " is ", int{p[r.offset + k]}, ", expected ",
                              int{expected[k]});
        }
      }
    }
    pos = r.offset + r.length;
  }
  return check_zero(pos, size);
}

std::string EncodeRanges(uint64_t seed, const std::vector<Range>& ranges) {
  std::string out = absl::StrCat(seed, " ", ranges.size());
  for (const Range& r : ranges) absl::StrAppend(&out, " ", r.offset, " ", r.length);
  return out;
}

bool DecodeRanges(const std::string& text, uint64_t& seed, std::vector<Range>& ranges) {
  std::istringstream in(text);
  size_t n = 0;
  if (!(in >> seed >> n)) return false;
  ranges.resize(n);
  for (Range& r : ranges) {
    if (!(in >> r.offset >> r.length)) return false;
  }
  return true;
}

}  // namespace tandem::transfer::testing
