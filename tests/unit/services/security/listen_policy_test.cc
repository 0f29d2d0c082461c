#include "services/security/listen_policy.h"

#include "gtest/gtest.h"

namespace tandem::security {
namespace {

TEST(ListenPolicyTest, LoopbackHosts) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) EXPECT_TRUE(IsLoopbackHost(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "example.com", "", "[::]"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(ListenPolicyTest, UnauthenticatedInternalPortsMayListenOnLoopbackOnly) {
  EXPECT_TRUE(CheckInternalListen("127.0.0.1:0", false, "--listen").ok());
  EXPECT_TRUE(CheckInternalListen("[::1]:5000", false, "--listen").ok());
  for (const char* addr : {"0.0.0.0:50061", "[::]:1", "10.1.2.3:9"}) {
    const absl::Status s = CheckInternalListen(addr, false, "--internal-listen");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << addr;
    for (const char* flag : {"--internal-listen", "--tls-cert", "--tls-key", "--tls-ca", "--cluster-token-file"}) {
      EXPECT_NE(s.message().find(flag), std::string::npos) << flag << " not in: " << s.message();
    }
    EXPECT_TRUE(CheckInternalListen(addr, true, "--internal-listen").ok()) << addr;
  }
  EXPECT_EQ(CheckInternalListen("no-port", true, "--listen").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::security
