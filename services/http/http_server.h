// An asynchronous HTTP/1.1 server for the public API (the OpenAI-compatible front end):
// keep-alive, answers sent whole or streamed as chunked transfer encoding (server-sent
// events), a client that goes away noticed while its answer is still being computed,
// bounded header and body sizes, connection counts and timeouts. Handlers never block a
// transport thread: a handler receives an Exchange and answers through it later, from
// any thread. Boost.Beast is compiled in http_server.cc only.
//
// Not the admin server (services/common/admin_server.h), which answers synchronously.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, undecoded
  Headers headers;
  std::string body;
  std::string peer;  // the client's address, for logs
  // The first header named `name` (case-insensitive), or "".
  std::string_view Header(std::string_view name) const;
  // The target without its query string.
  std::string_view Path() const;
};

// One request's answer. Every method may be called from any thread; calls after the
// answer ended, or after the client went away, do nothing. Exactly one of Respond or
// StartStream ... EndStream answers a request; dropping the last reference to an
// Exchange that never answered sends 500.
class Exchange {
 public:
  virtual ~Exchange() = default;

  // The whole answer.
  virtual void Respond(int status, std::string content_type, std::string body, Headers headers = {}) = 0;

  // A streamed answer: the status line and headers now (chunked transfer encoding), then
  // Send per piece, then EndStream. Send returns false once more than the high-water
  // mark is waiting to go out (a slow reader): the caller should hold further data until
  // its on_writable handler runs. Data given to Send is always kept and sent.
  virtual void StartStream(int status, std::string content_type, Headers headers = {}) = 0;
  virtual bool Send(std::string data) = 0;
  virtual void EndStream() = 0;

  // Handlers, set before answering: on_gone once if the client disconnects (or a write
  // fails or times out) before the answer ended; on_writable after Send returned false,
  // once the backlog drained below the low-water mark. They run on a transport thread and
  // must not block.
  virtual void SetHandlers(std::function<void()> on_gone, std::function<void()> on_writable) = 0;
};

struct ServerOptions {
  int threads = 2;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 8 << 20;
  int max_connections = 4096;
  // Reading one request, from its first byte (or the connection's start) to its last:
  // a client that sends slower than this is cut off (408).
  std::chrono::milliseconds read_timeout{30000};
  // A kept-alive connection with no request in progress closes after this.
  std::chrono::milliseconds idle_timeout{60000};
  // A write that makes no progress for this long ends the connection (the client
  // stopped reading); the request is told on_gone.
  std::chrono::milliseconds write_timeout{60000};
  // Streamed answers: Send returns false above high_water bytes waiting, on_writable
  // runs when they drain below low_water.
  size_t high_water_bytes = 1 << 20;
  size_t low_water_bytes = 256 << 10;
  std::string server_name = "tandem";
  // HTTPS: a PEM certificate chain and its PEM private key (both or neither). TLS 1.2 and
  // later; a client that does not complete the handshake within read_timeout is closed.
  std::string tls_cert_file;
  std::string tls_key_file;
};

class Server {
 public:
  using Handler = std::function<void(Request&&, std::shared_ptr<Exchange>)>;
  using ErrorSink = std::function<void(const std::string&)>;

  // Binds `host_port` (port 0: any free port) and serves on options.threads threads.
  // INVALID_ARGUMENT for a bad address or unusable TLS files (naming the file),
  // UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const std::string& host_port, const ServerOptions& options,
                                                       Handler handler, ErrorSink on_error);
  virtual ~Server() = default;  // implementations Stop()
  virtual std::string bound_address() const = 0;
  virtual uint16_t bound_port() const = 0;
  // Connections open now (for tests and metrics).
  virtual int connections() const = 0;
  // Stops accepting, closes every connection (their requests are told on_gone), joins
  // the threads. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace tandem::http
