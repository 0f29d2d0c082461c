// Helpers of the UCX engine that need no UCX at run time: status mapping, the streaming
// copy into mapped memory, UCX_TLS parsing, the published address and process watching.
#include "services/common/transfer/ucx_support.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include <algorithm>

#include "gtest/gtest.h"
#include "services/common/transfer/ucx_peer_address.h"

namespace tandem::transfer::internal {
namespace {

TEST(UcxSupportTest, MapsUcxStatuses) {
  EXPECT_TRUE(FromUcs(UCS_OK, "x").ok());
  EXPECT_EQ(FromUcs(UCS_ERR_CONNECTION_RESET, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_UNREACHABLE, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_ENDPOINT_TIMEOUT, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromUcs(UCS_ERR_CANCELED, "x").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(FromUcs(UCS_ERR_INVALID_PARAM, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromUcs(UCS_ERR_NO_MEMORY, "x").code(), absl::StatusCode::kResourceExhausted);
  const absl::Status s = FromUcs(UCS_ERR_UNREACHABLE, "connecting");
  EXPECT_EQ(s.message().substr(0, 11), "connecting:");
}

TEST(UcxSupportTest, CopyToMappedCopiesEveryByteAtAnyAlignment) {
  std::mt19937_64 rng(7);
  const size_t max = (32u << 20) + 256;
  std::vector<uint8_t> src(max + 64), dst(max + 64);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{65535}, size_t{65536}, size_t{65537},
                   size_t{147456}, size_t{(1u << 20) + 13}, size_t{(32u << 20) - 1},
                   size_t{(32u << 20) + 5}}) {
    for (size_t dst_off : {0, 1, 15, 31}) {
      for (size_t src_off : {0, 3}) {
        if (n > (4u << 20) && (dst_off != 1 || src_off != 3)) continue;  // keep it quick
        std::fill(dst.begin(), dst.end(), 0xee);
        CopyToMapped(reinterpret_cast<char*>(dst.data() + dst_off), src.data() + src_off, n);
        StoreFence();
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << "n=" << n << " dst_off=" << dst_off << " src_off=" << src_off;
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee) << "wrote before";
        ASSERT_EQ(dst[dst_off + n], 0xee) << "wrote after, n=" << n;
      }
    }
  }
}

TEST(UcxSupportTest, TlsIncludesTcp) {
  EXPECT_TRUE(TlsIncludesTcp(""));
  EXPECT_TRUE(TlsIncludesTcp("all"));
  EXPECT_TRUE(TlsIncludesTcp("tcp"));
  EXPECT_TRUE(TlsIncludesTcp("sm,tcp"));
  EXPECT_TRUE(TlsIncludesTcp("^sm"));
  EXPECT_FALSE(TlsIncludesTcp("sm,self"));
  EXPECT_FALSE(TlsIncludesTcp("posix,cma,self"));
  EXPECT_FALSE(TlsIncludesTcp("^tcp,sm"));
  EXPECT_FALSE(TlsIncludesTcp("tcpx"));
}

TEST(UcxPeerAddressTest, RoundTripsAndRejectsGarbage) {
  UcxPeerAddress a;
  a.owner = ProcessIdentity::Self();
  a.worker_address = std::string("\x01\x00\xffworker", 9);
  absl::StatusOr<UcxPeerAddress> b = UcxPeerAddress::Decode(a.Encode());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->worker_address, a.worker_address);
  EXPECT_EQ(b->owner.pid, a.owner.pid);
  EXPECT_EQ(b->owner.start_time, a.owner.start_time);
  EXPECT_EQ(b->owner.boot_id, a.owner.boot_id);
  EXPECT_EQ(b->owner.pid_namespace, a.owner.pid_namespace);

  const std::string wire = a.Encode();
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_FALSE(UcxPeerAddress::Decode(wire.substr(0, n)).ok()) << "prefix " << n;
  }
  EXPECT_FALSE(UcxPeerAddress::Decode(wire + "x").ok());
  EXPECT_FALSE(UcxPeerAddress::Decode("inproc:1").ok());
}

TEST(ProcessIdentityTest, WatchesLiveAndExitedProcesses) {
  const ProcessIdentity self = ProcessIdentity::Self();
  EXPECT_GT(self.start_time, 0u);
  EXPECT_FALSE(self.boot_id.empty());
  EXPECT_TRUE(self.CanWatch(self));
  ProcessIdentity elsewhere = self;
  elsewhere.boot_id = "another-boot";
  EXPECT_FALSE(self.CanWatch(elsewhere));

  absl::StatusOr<int> fd = OpenProcessHandle(self);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_FALSE(ProcessExited(*fd));
  close(*fd);

  ProcessIdentity reused = self;  // same pid, another start time: not the same process
  reused.start_time += 1;
  EXPECT_EQ(OpenProcessHandle(reused).status().code(), absl::StatusCode::kUnavailable);

  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ProcessIdentity c = self;
  c.pid = static_cast<uint32_t>(child);
  // Read it the same way ProcessIdentity::Self() does, from /proc.
  {
    FILE* f = fopen(("/proc/" + std::to_string(child) + "/stat").c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    std::string stat(buf);
    std::istringstream fields(stat.substr(stat.rfind(')') + 1));
    std::string field;
    for (int i = 3; i <= 22; ++i) fields >> field;
    c.start_time = std::stoull(field);
  }
  fd = OpenProcessHandle(c);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_FALSE(ProcessExited(*fd));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(ProcessExited(*fd));
  close(*fd);
  EXPECT_EQ(OpenProcessHandle(c).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::transfer::internal
