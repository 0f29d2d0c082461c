// XXH3-64 checksums so that both ends of a transfer can verify what arrived (docs/design.md §5:
// "sizes are checked on arrival"). The layout fingerprint is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem::transfer {

// XXH3-64 of [data, data + length) with `seed`. Same value as XXH3_64bits_withSeed.
uint64_t Checksum(const void* data, size_t length, uint64_t seed = 0);

// Streaming form: Update() over pieces gives the same value as Checksum() over their
// concatenation. Not thread-safe.
class ChecksumBuilder {
 public:
  explicit ChecksumBuilder(uint64_t seed = 0);
  ~ChecksumBuilder();
  ChecksumBuilder(const ChecksumBuilder&) = delete;
  ChecksumBuilder& operator=(const ChecksumBuilder&) = delete;

  void Update(const void* data, size_t length);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::transfer
