// ProbeTcp (tcp_probe.h): a listening socket accepts, even when nobody calls accept() (a
// stopped process's listener); a port nothing listens on refuses.
#include "services/common/tcp_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace tandem::service {
namespace {

// A loopback TCP socket on a free port, listening or only bound.
class LoopbackSocket {
 public:
  explicit LoopbackSocket(bool listening) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (listening) EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~LoopbackSocket() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

constexpr std::chrono::milliseconds kTimeout{2000};

TEST(TcpProbeTest, AListenerAcceptsEvenWhenNobodyCallsAccept) {
  LoopbackSocket s(/*listening=*/true);
  EXPECT_EQ(ProbeTcp(s.address(), kTimeout), TcpProbeResult::kAccepted);
  EXPECT_EQ(ProbeTcp(s.address(), kTimeout), TcpProbeResult::kAccepted);
}

TEST(TcpProbeTest, APortNothingListensOnRefuses) {
  LoopbackSocket bound(/*listening=*/false);  // holds the port, so nothing else takes it
  EXPECT_EQ(ProbeTcp(bound.address(), kTimeout), TcpProbeResult::kRefused);
  LoopbackSocket was(/*listening=*/true);
  const std::string address = was.address();
  ASSERT_EQ(ProbeTcp(address, kTimeout), TcpProbeResult::kAccepted);
  was.Close();  // as when its process exits
  EXPECT_EQ(ProbeTcp(address, kTimeout), TcpProbeResult::kRefused);
}

TEST(TcpProbeTest, WhatCannotBeProbedIsUnknown) {
  EXPECT_EQ(ProbeTcp("not an address", kTimeout), TcpProbeResult::kUnknown);
  EXPECT_EQ(ProbeTcp("127.0.0.1:0", kTimeout), TcpProbeResult::kUnknown);
  EXPECT_EQ(ProbeTcp("no-such-host.invalid:80", kTimeout), TcpProbeResult::kUnknown);
}

}  // namespace
}  // namespace tandem::service
