#include "services/security/listen_policy.h"

#include <arpa/inet.h>

#include "absl/strings/str_cat.h"
#include "services/common/host_port.h"
#include "spdlog/spdlog.h"

namespace tandem::security {

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  const std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status CheckInternalListen(const std::string& host_port, bool authenticated, std::string_view flag) {
  absl::StatusOr<service::HostPort> hp = service::ParseHostPort(host_port);
  if (!hp.ok()) return absl::InvalidArgumentError(absl::StrCat(std::string(flag), ": ", hp.status().message()));
  if (authenticated) return absl::OkStatus();
  if (!IsLoopbackHost(hp->host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(flag), " ", host_port,
        ": Tandem's internal services (Cluster, Prefill, Decode, KvStore) may listen beyond loopback only with "
        "credentials: give --tls-cert, --tls-key and --tls-ca (mutual TLS) or --cluster-token-file "
        "(see docs/security.md)"));
  }
  spdlog::warn("{} {}: internal services WITHOUT authentication (no --tls-cert/--tls-key/--tls-ca, no "
               "--cluster-token-file): any process on this host may register replicas or call them",
               flag, host_port);
  return absl::OkStatus();
}

}  // namespace tandem::security
