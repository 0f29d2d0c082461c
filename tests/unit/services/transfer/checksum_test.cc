#include "services/common/transfer/checksum.h"

#include <xxhash.h>

#include <string>

#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

TEST(ChecksumTest, MatchesXxh3WithSeed) {
  const std::string data = "the quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Checksum(data.data(), data.size(), 0), XXH3_64bits(data.data(), data.size()));
  EXPECT_EQ(Checksum(data.data(), data.size(), 42),
            XXH3_64bits_withSeed(data.data(), data.size(), 42));
  EXPECT_NE(Checksum(data.data(), data.size(), 1), Checksum(data.data(), data.size(), 2));
}

TEST(ChecksumTest, StreamingEqualsOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + (i >> 9));
  for (size_t piece : {1, 7, 64, 240, 4096, 65536}) {
    ChecksumBuilder builder(7);
    for (size_t off = 0; off < data.size(); off += piece) {
      builder.Update(data.data() + off, std::min(piece, data.size() - off));
    }
    EXPECT_EQ(builder.Digest(), Checksum(data.data(), data.size(), 7)) << "piece " << piece;
  }
  ChecksumBuilder empty(3);
  EXPECT_EQ(empty.Digest(), Checksum(nullptr, 0, 3));
}

}  // namespace
}  // namespace tandem::transfer
