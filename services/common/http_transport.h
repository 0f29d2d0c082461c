// The HTTP/1.1 transport under AdminServer, on Boost.Beast. Internal to services/common:
// use AdminServer. This header includes no Boost header; Beast is compiled in
// http_transport.cc only (it is the slow file to compile).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/common/admin_server.h"

namespace tandem::service::internal {

class HttpTransport {
 public:
  // Answers one request; runs on a transport thread, must not throw. Receives method,
  // target and headers (path and query are left for it to decode).
  using Dispatch = std::function<HttpResponse(HttpRequest&&)>;
  // Reports a transport-level failure (accept errors and the like) for logging.
  using ErrorSink = std::function<void(const std::string&)>;

  // Binds `host_port` and serves on `options.threads` threads until Stop(). Errors:
  // INVALID_ARGUMENT for a bad address, UNAVAILABLE when it cannot be resolved or bound.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Start(const std::string& host_port,
                                                              const AdminServer::Options& options,
                                                              Dispatch dispatch, ErrorSink on_error);

  virtual ~HttpTransport() = default;  // implementations Stop()
  virtual std::string bound_address() const = 0;
  virtual uint16_t bound_port() const = 0;
  // Stops accepting, closes every connection, joins the threads. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace tandem::service::internal
