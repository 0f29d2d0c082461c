// Binds HOST:PORT for a Boost.Asio server (the admin server and the public HTTP API): the
// first resolved address that opens, binds (address reuse on) and listens. `what` names
// the server in errors. INVALID_ARGUMENT for a bad address, UNAVAILABLE when it cannot be
// resolved or bound.
#pragma once

#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "absl/status/statusor.h"

namespace tandem::service {

absl::StatusOr<boost::asio::ip::tcp::acceptor> ListenTcp(boost::asio::io_context& ioc, const std::string& host_port,
                                                         const std::string& what);

}  // namespace tandem::service
