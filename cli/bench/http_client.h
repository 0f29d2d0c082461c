// A small asynchronous HTTP/1.1 client for the benchmark's OpenAI backends: requests to
// one server over a pool of kept-alive connections (one request at a time on each, as
// HTTP/1.1 clients do without pipelining), the response body handed over piece by piece
// as it is read, so that streamed events are timed when they arrive rather than once
// the answer ended. Plain http only. Boost.Beast is compiled in http_client.cc only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::cli {

using HttpClock = std::chrono::steady_clock;
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpBaseUrl {
  std::string host;   // without brackets
  uint16_t port = 80;
  std::string path;   // "/v1" for http://HOST:PORT/v1; "" for none; never a trailing '/'
};

// http://HOST[:PORT][/PATH]. INVALID_ARGUMENT for anything else; UNIMPLEMENTED for https.
absl::StatusOr<HttpBaseUrl> ParseHttpBaseUrl(const std::string& url);

struct HttpResponseHandlers {
  // The status line and headers arrived.
  std::function<void(int status, const HttpHeaders& headers)> on_head;
  // Body bytes, chunked transfer encoding removed, as they are read; `at`: when.
  std::function<void(std::string_view bytes, HttpClock::time_point at)> on_body;
  // Once, last. OK when the whole response was read; UNAVAILABLE when the server could
  // not be reached or the connection broke; DEADLINE_EXCEEDED past the deadline.
  std::function<void(const absl::Status& status)> on_done;
};

struct HttpWholeResponse {
  int status = 0;
  std::string body;
};

class HttpClient {
 public:
  // Resolves the server's address now; `threads` run the connections. UNAVAILABLE when
  // the host does not resolve.
  static absl::StatusOr<std::unique_ptr<HttpClient>> Create(const HttpBaseUrl& url, int threads);

  // Waits for nothing: every request must have ended (on_done ran) before.
  virtual ~HttpClient() = default;

  // Sends one request on an idle kept-alive connection, or on a new one. A kept-alive
  // connection that the server closed meanwhile is noticed and the request sent again
  // once on a new connection (the server received none of it). The handlers run on the
  // client's threads, one at a time for a request, and must not block.
  virtual void Send(std::string method, std::string target, HttpHeaders headers, std::string body,
                    HttpClock::time_point deadline, HttpResponseHandlers handlers) = 0;

  // Connections opened so far (kept-alive ones are reused, not counted again).
  virtual int connections_opened() const = 0;

  // Send, waiting for the whole answer (setup requests, not timed).
  absl::StatusOr<HttpWholeResponse> Fetch(std::string method, std::string target, HttpHeaders headers,
                                          std::string body, double timeout_s);
};

}  // namespace tandem::cli
