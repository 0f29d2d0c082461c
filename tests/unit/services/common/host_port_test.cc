#include "services/common/host_port.h"

#include <gtest/gtest.h>

namespace tandem::service {
namespace {

TEST(HostPortTest, ParsesHostNamesAndIpv4) {
  auto parsed = ParseHostPort("127.0.0.1:9000");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_EQ(parsed->port, 9000);

  parsed = ParseHostPort("router-0.tandem.svc:0");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "router-0.tandem.svc");
  EXPECT_EQ(parsed->port, 0);

  parsed = ParseHostPort("localhost:65535");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->port, 65535);
}

TEST(HostPortTest, ParsesBracketedIpv6) {
  auto parsed = ParseHostPort("[::1]:8080");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "::1");
  EXPECT_EQ(parsed->port, 8080);
  parsed = ParseHostPort("[fe80::1:2]:1");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "fe80::1:2");
}

TEST(HostPortTest, FormatsWithBracketsForIpv6) {
  EXPECT_EQ(FormatHostPort("127.0.0.1", 80), "127.0.0.1:80");
  EXPECT_EQ(FormatHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ((HostPort{"::", 0}).ToString(), "[::]:0");
  for (const char* address : {"127.0.0.1:9000", "[::1]:0", "localhost:1"}) {
    auto parsed = ParseHostPort(address);
    ASSERT_TRUE(parsed.ok()) << address;
    EXPECT_EQ(parsed->ToString(), address);
  }
}

TEST(HostPortTest, RejectsBadAddressesWithTheReason) {
  struct Case {
    const char* address;
    const char* reason;
  };
  const Case cases[] = {
      {"", "empty"},
      {"localhost", "missing ':PORT'"},
      {"localhost:", "empty port"},
      {":9000", "empty host"},
      {"host:http", "not a number"},
      {"host:-1", "not a number"},
      {"host:65536", "out of range"},
      {"host:123456", "out of range"},
      {"::1:80", "needs brackets"},
      {"[::1:80", "missing ']'"},
      {"[::1]80", "missing ':PORT'"},
      {"[]:80", "empty IPv6"},
      {"[not-v6]:80", "not an IPv6 address"},
      {"ho st:80", "cannot appear"},
      {"host/x:80", "cannot appear"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseHostPort(c.address);
    ASSERT_FALSE(parsed.ok()) << c.address;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.address;
    EXPECT_NE(parsed.status().message().find(c.reason), std::string::npos)
        << c.address << ": " << parsed.status();
  }
}

}  // namespace
}  // namespace tandem::service
