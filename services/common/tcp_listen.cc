#include "services/common/tcp_listen.h"

#include "absl/strings/str_cat.h"
#include "services/common/host_port.h"

namespace tandem::service {

absl::StatusOr<boost::asio::ip::tcp::acceptor> ListenTcp(boost::asio::io_context& ioc, const std::string& host_port,
                                                         const std::string& what) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  absl::StatusOr<HostPort> parsed = ParseHostPort(host_port);
  if (!parsed.ok()) return parsed.status();
  boost::system::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(parsed->host, std::to_string(parsed->port),
                                    tcp::resolver::numeric_service | tcp::resolver::passive, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(what, ": cannot resolve '", parsed->host, "': ", ec.message()));
  std::string last_error = "no address";
  for (const auto& entry : endpoints) {
    tcp::acceptor acceptor(ioc);
    if (acceptor.open(entry.endpoint().protocol(), ec) ||
        acceptor.set_option(asio::socket_base::reuse_address(true), ec) || acceptor.bind(entry.endpoint(), ec) ||
        acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
      last_error = ec.message();
      continue;
    }
    return acceptor;
  }
  return absl::UnavailableError(absl::StrCat(what, ": cannot listen on ", host_port, ": ", last_error));
}

}  // namespace tandem::service
