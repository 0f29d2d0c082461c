#include "services/common/transfer/remote_memory_descriptor.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tandem::transfer {
namespace {

RemoteMemoryDescriptor Sample() {
  RemoteMemoryDescriptor d;
  d.transport = "ucx";
  d.engine_address = std::string("\x00\x01\x02worker-address\xff", 18);
  d.base = 0x7f0012345000;
  d.length = 64ull << 20;
  d.rkey = std::string("\x03\x00rkey\x80\x81", 8);
  return d;
}

TEST(RemoteMemoryDescriptorTest, RoundTrips) {
  const RemoteMemoryDescriptor d = Sample();
  absl::StatusOr<RemoteMemoryDescriptor> parsed = RemoteMemoryDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, d);

  RemoteMemoryDescriptor no_rkey = d;
  no_rkey.rkey.clear();
  parsed = RemoteMemoryDescriptor::Parse(no_rkey.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, no_rkey);
}

TEST(RemoteMemoryDescriptorTest, EveryTruncationIsACleanError) {
  const std::string wire = Sample().Serialize();
  for (size_t n = 0; n < wire.size(); ++n) {
    absl::StatusOr<RemoteMemoryDescriptor> parsed =
        RemoteMemoryDescriptor::Parse(std::string_view(wire).substr(0, n));
    ASSERT_FALSE(parsed.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(RemoteMemoryDescriptor::Parse(wire + "x").ok()) << "trailing byte accepted";
}

TEST(RemoteMemoryDescriptorTest, EveryFlippedByteIsDetected) {
  const std::string wire = Sample().Serialize();
  for (size_t i = 0; i < wire.size(); ++i) {
    std::string corrupt = wire;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    absl::StatusOr<RemoteMemoryDescriptor> parsed = RemoteMemoryDescriptor::Parse(corrupt);
    ASSERT_FALSE(parsed.ok()) << "flip at byte " << i << " went unnoticed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(RemoteMemoryDescriptorTest, GarbageIsACleanError) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::string garbage(rng() % 300, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    if (i % 2 == 0 && garbage.size() >= 5) garbage.replace(0, 5, std::string("TKVD\x01", 5));
    EXPECT_FALSE(RemoteMemoryDescriptor::Parse(garbage).ok());
  }
  EXPECT_FALSE(RemoteMemoryDescriptor::Parse("").ok());
  EXPECT_FALSE(RemoteMemoryDescriptor::Parse("{\"base\": 1}").ok());
  // A huge declared field length must not be trusted.
  EXPECT_FALSE(RemoteMemoryDescriptor::Parse(std::string("TKVD\x01\x03\x00ucx\xff\xff\xff\xff", 14)).ok());
}

TEST(RemoteMemoryDescriptorTest, RejectsUnknownVersionAndOverflow) {
  std::string wire = Sample().Serialize();
  wire[4] = 2;
  absl::StatusOr<RemoteMemoryDescriptor> parsed = RemoteMemoryDescriptor::Parse(wire);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("version"), std::string_view::npos);

  RemoteMemoryDescriptor d = Sample();
  d.base = std::numeric_limits<uint64_t>::max() - 10;
  d.length = 11;
  EXPECT_FALSE(RemoteMemoryDescriptor::Parse(d.Serialize()).ok());
  d.length = 10;
  EXPECT_TRUE(RemoteMemoryDescriptor::Parse(d.Serialize()).ok());
}

TEST(RemoteMemoryDescriptorTest, Slice) {
  const RemoteMemoryDescriptor d = Sample();
  absl::StatusOr<RemoteMemoryDescriptor> s = d.Slice(4096, 8192);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->base, d.base + 4096);
  EXPECT_EQ(s->length, 8192u);
  EXPECT_EQ(s->rkey, d.rkey);
  EXPECT_EQ(s->engine_address, d.engine_address);
  EXPECT_TRUE(d.Slice(d.length, 0).ok());
  EXPECT_FALSE(d.Slice(d.length, 1).ok());
  EXPECT_FALSE(d.Slice(1, d.length).ok());
  EXPECT_FALSE(d.Slice(std::numeric_limits<uint64_t>::max(), 2).ok());
}

}  // namespace
}  // namespace tandem::transfer
