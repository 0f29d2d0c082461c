// Deterministic byte patterns for transfer tests: the byte at destination offset o is a
// function of (seed, o), so a receiver can verify byte-exactly what should have arrived
// from the seed and the list of written ranges alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::transfer::testing {

struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
};

uint8_t PatternByte(uint64_t seed, uint64_t offset);
// Writes the pattern of destination bytes [dest_offset, dest_offset + length) into out.
void FillPattern(uint64_t seed, uint64_t dest_offset, void* out, size_t length);
// Checks that bytes inside `ranges` follow the pattern and every other byte is zero.
// Returns "" when they do, else where the first difference is.
std::string VerifyPattern(const void* buffer, size_t size, uint64_t seed,
                          const std::vector<Range>& ranges);

// "seed n off len off len ..." and back (the peer process's VERIFY command).
std::string EncodeRanges(uint64_t seed, const std::vector<Range>& ranges);
bool DecodeRanges(const std::string& text, uint64_t& seed, std::vector<Range>& ranges);

}  // namespace tandem::transfer::testing
