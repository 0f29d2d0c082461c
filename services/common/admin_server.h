// The admin HTTP server of every service (docs/design.md §1, §9): /metrics (Prometheus),
// /healthz, /readyz, service-specific pages and static files (the router's dashboard).
// HTTP/1.1 with keep-alive, GET and HEAD only, served by its own threads: the caller
// never blocks on it, and slow or broken clients cannot wedge it (each request must
// arrive whole within `request_timeout`; requests over `max_request_bytes` get 413,
// malformed ones 400; connections past `max_connections` are closed at once).
//
//   AdminServer admin(registry);
//   admin.AddHandler("/stats", [&](const HttpRequest&) { return HttpResponse::Json(...); });
//   RETURN_IF_ERROR(admin.Start(flags.admin_listen));
//   ... admin.bound_address() into the ready file ...
//   admin.SetReady(true);
//
// No Boost header here: the transport (Boost.Beast) is compiled in http_transport.cc only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace tandem::service {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD" (handlers see no other)
  std::string target;  // as sent: "/metrics?x=1"
  std::string path;    // percent-decoded path without the query: "/metrics"
  std::string query;   // raw query after '?', or ""
  std::vector<std::pair<std::string, std::string>> headers;  // in arrival order

  // The first header named `name` (case-insensitive), or "".
  std::string Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers

  static HttpResponse Text(int status, std::string body);
  static HttpResponse Json(std::string body, int status = 200);
};

class AdminServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  struct Options {
    int threads = 2;
    // Time for a whole request to arrive, counted from when the server starts waiting
    // for it (also the idle limit of a kept-alive connection).
    std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
    // Time for a whole response to be written.
    std::chrono::milliseconds write_timeout{std::chrono::seconds(10)};
    size_t max_request_bytes = 64 * 1024;  // headers and body each
    int max_connections = 256;
    std::string server_name = "tandem";  // the Server header
  };

  // `metrics` (usually a prometheus::Registry) is serialized on each GET /metrics; null
  // serves an empty exposition. The server keeps a reference to it.
  explicit AdminServer(std::shared_ptr<prometheus::Collectable> metrics = nullptr);
  AdminServer(std::shared_ptr<prometheus::Collectable> metrics, Options options);
  ~AdminServer();  // Stop()s
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Serves GET/HEAD on exactly `path` ("/stats"; the query string is ignored when
  // matching) with `handler`, run on a server thread; it must be quick and thread-safe,
  // and an exception it throws becomes a 500. Replaces an earlier handler of the same
  // path, built-ins included. May be called before or after Start().
  void AddHandler(std::string path, Handler handler);

  // Serves the files under `directory` at `url_prefix` ("/dashboard" serves
  // directory/app.js at /dashboard/app.js and directory/index.html at /dashboard/;
  // /dashboard redirects there), with content types from the extension (html, js, css,
  // json, svg, png, ...). Paths that would leave the directory ("." or ".." segments,
  // encoded or not, or a symlink pointing out) are refused with 404. Exact handlers
  // win over static files; the longest prefix wins among directories.
  // Errors: NOT_FOUND if `directory` is not a directory, INVALID_ARGUMENT for a prefix
  // not starting with '/'.
  absl::Status AddStaticDirectory(std::string url_prefix, const std::string& directory);

  // Binds `host_port` ("127.0.0.1:0": any free port) and starts serving on background
  // threads; returns once the socket listens. Errors: INVALID_ARGUMENT for a bad
  // address, UNAVAILABLE when it cannot be resolved or bound (with the system's
  // reason), FAILED_PRECONDITION when already started.
  absl::Status Start(const std::string& host_port);

  // The bound address ("127.0.0.1:41234"), or "" before Start().
  std::string bound_address() const;
  uint16_t bound_port() const;

  // /readyz answers 200 "ready" when true, 503 "not ready" otherwise (the default).
  void SetReady(bool ready);
  bool ready() const;

  // Stops accepting, closes every connection and joins the threads. Idempotent; the
  // server cannot be started again.
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::service
