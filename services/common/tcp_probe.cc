#include "services/common/tcp_probe.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "services/common/host_port.h"

namespace tandem::service {
namespace {

TcpProbeResult ProbeOne(const addrinfo& a, std::chrono::milliseconds timeout) {
  const int fd = socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return TcpProbeResult::kUnknown;
  int err = 0;
  if (connect(fd, a.ai_addr, a.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      int n;
      do {
        n = poll(&p, 1, static_cast<int>(timeout.count()));
      } while (n < 0 && errno == EINTR);
      if (n <= 0) {
        close(fd);
        return TcpProbeResult::kUnknown;  // no answer in time (a firewall dropping, a far host)
      }
      socklen_t len = sizeof(err);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  close(fd);
  if (err == 0) return TcpProbeResult::kAccepted;
  return err == ECONNREFUSED ? TcpProbeResult::kRefused : TcpProbeResult::kUnknown;
}

}  // namespace

TcpProbeResult ProbeTcp(const std::string& address, std::chrono::milliseconds timeout) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok() || hp->port == 0) return TcpProbeResult::kUnknown;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  if (getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &list) != 0) {
    return TcpProbeResult::kUnknown;
  }
  bool all_refused = list != nullptr;
  bool accepted = false;
  for (const addrinfo* a = list; a != nullptr && !accepted; a = a->ai_next) {
    const TcpProbeResult r = ProbeOne(*a, timeout);
    accepted = r == TcpProbeResult::kAccepted;
    all_refused &= r == TcpProbeResult::kRefused;
  }
  freeaddrinfo(list);
  if (accepted) return TcpProbeResult::kAccepted;
  return all_refused ? TcpProbeResult::kRefused : TcpProbeResult::kUnknown;
}

}  // namespace tandem::service
