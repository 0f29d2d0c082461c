// Boost.Beast lives in this file only (compile time): the header is a pimpl.
#include "services/common/admin_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <thread>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "services/common/host_port.h"
#include "spdlog/spdlog.h"

namespace tandem::service {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr size_t kMaxStaticFileBytes = 64 << 20;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "ok";
    case 400: return "bad request";
    case 404: return "not found";
    case 405: return "method not allowed";
    case 413: return "request too large";
    case 500: return "internal error";
    case 503: return "not ready";
    default: return "";
  }
}

std::string ContentTypeFor(const std::filesystem::path& file) {
  static const std::map<std::string, std::string> kTypes = {
      {".html", "text/html; charset=utf-8"},
      {".htm", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".json", "application/json"},
      {".map", "application/json"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".jpg", "image/jpeg"},
      {".jpeg", "image/jpeg"},
      {".ico", "image/x-icon"},
      {".txt", "text/plain; charset=utf-8"},
      {".woff2", "font/woff2"},
  };
  auto it = kTypes.find(absl::AsciiStrToLower(file.extension().string()));
  return it == kTypes.end() ? "application/octet-stream" : it->second;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes a URL path; std::nullopt for a malformed escape or a NUL byte.
std::optional<std::string> DecodePath(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '%') {
      if (i + 2 >= raw.size()) return std::nullopt;
      int hi = HexValue(raw[i + 1]), lo = HexValue(raw[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    }
    if (c == '\0') return std::nullopt;
    out.push_back(c);
  }
  return out;
}

struct StaticDirectory {
  std::string prefix;              // "/dashboard", or "" for the root
  std::filesystem::path root;      // canonical
};

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

HttpResponse HttpResponse::Text(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

HttpResponse HttpResponse::Json(std::string body, int status) {
  HttpResponse response;
  response.status = status;
  response.content_type = "application/json";
  response.body = std::move(body);
  return response;
}

class AdminServer::Impl {
 public:
  Impl(std::shared_ptr<prometheus::Collectable> metrics, Options options)
      : metrics_(std::move(metrics)), options_(std::move(options)) {
    handlers_["/healthz"] = [](const HttpRequest&) { return HttpResponse::Text(200, "ok\n"); };
    handlers_["/readyz"] = [this](const HttpRequest&) {
      return ready_.load() ? HttpResponse::Text(200, "ready\n") : HttpResponse::Text(503, "not ready\n");
    };
    handlers_["/metrics"] = [this](const HttpRequest&) { return Metrics(); };
  }

  ~Impl() { Stop(); }

  void AddHandler(std::string path, Handler handler) {
    std::unique_lock lock(routes_mu_);
    handlers_[std::move(path)] = std::move(handler);
  }

  absl::Status AddStaticDirectory(std::string prefix, const std::string& directory) {
    if (prefix.empty() || prefix.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("static directory prefix '", prefix, "' must start with '/'"));
    }
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    std::error_code ec;
    std::filesystem::path root = std::filesystem::canonical(directory, ec);
    if (ec || !std::filesystem::is_directory(root, ec)) {
      return absl::NotFoundError(absl::StrCat("static directory '", directory, "' is not a directory"));
    }
    std::unique_lock lock(routes_mu_);
    static_dirs_.push_back({std::move(prefix), std::move(root)});
    // Longest prefix first.
    std::stable_sort(static_dirs_.begin(), static_dirs_.end(),
                     [](const auto& a, const auto& b) { return a.prefix.size() > b.prefix.size(); });
    return absl::OkStatus();
  }

  absl::Status Start(const std::string& host_port) {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    if (started_ || stopped_) {
      return absl::FailedPreconditionError("admin server already started (or stopped)");
    }
    auto parsed = ParseHostPort(host_port);
    if (!parsed.ok()) return parsed.status();

    boost::system::error_code ec;
    tcp::resolver resolver(ioc_);
    auto endpoints = resolver.resolve(parsed->host, std::to_string(parsed->port),
                                      tcp::resolver::numeric_service | tcp::resolver::passive, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("admin server: cannot resolve '", parsed->host,
                                                 "': ", ec.message()));
    }
    std::string last_error = "no address";
    for (const auto& entry : endpoints) {
      tcp::acceptor acceptor(ioc_);
      if (acceptor.open(entry.endpoint().protocol(), ec) ||
          acceptor.set_option(asio::socket_base::reuse_address(true), ec) ||
          acceptor.bind(entry.endpoint(), ec) || acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
        last_error = ec.message();
        continue;
      }
      acceptor_.emplace(std::move(acceptor));
      break;
    }
    if (!acceptor_) {
      return absl::UnavailableError(
          absl::StrCat("admin server: cannot listen on ", host_port, ": ", last_error));
    }
    tcp::endpoint local = acceptor_->local_endpoint(ec);
    bound_address_ = FormatHostPort(local.address().to_string(), local.port());
    bound_port_ = local.port();
    started_ = true;

    Accept();
    const int threads = std::max(1, options_.threads);
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] { Run(); });
    }
    return absl::OkStatus();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    if (stopped_) return;
    stopped_ = true;
    ioc_.stop();
    for (auto& thread : threads_) thread.join();
    threads_.clear();
    // Nothing runs now: close the listener and every connection. The suspended
    // coroutines themselves are destroyed with the io_context.
    boost::system::error_code ec;
    if (acceptor_) acceptor_->close(ec);
    std::lock_guard<std::mutex> sessions_lock(sessions_mu_);
    for (beast::tcp_stream* stream : sessions_) stream->socket().close(ec);
  }

  std::string bound_address() const {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    return bound_address_;
  }
  uint16_t bound_port() const {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    return bound_port_;
  }
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }

 private:
  void Run() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("admin server: handler failed: {}", e.what());
      }
    }
  }

  void Accept() {
    acceptor_->async_accept(asio::make_strand(ioc_), [this](boost::system::error_code ec, tcp::socket socket) {
      OnAccept(ec, std::move(socket));
    });
  }

  void OnAccept(boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    if (ec) {
      // Out of descriptors and the like: back off rather than spin.
      spdlog::warn("admin server: accept failed: {}", ec.message());
      accept_backoff_.expires_after(std::chrono::milliseconds(50));
      accept_backoff_.async_wait([this](boost::system::error_code) { Accept(); });
      return;
    }
    if (connections_.load() >= options_.max_connections) {
      socket.close(ec);
    } else {
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  }

  // One connection: read a request, answer it, repeat while kept alive. Owned by the
  // handlers of its pending operation (shared_ptr); runs on its own strand.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* impl, tcp::socket socket) : impl_(impl), stream_(std::move(socket)) {
      impl_->connections_.fetch_add(1);
      std::lock_guard<std::mutex> lock(impl_->sessions_mu_);
      impl_->sessions_.insert(&stream_);
    }
    ~Session() {
      {
        std::lock_guard<std::mutex> lock(impl_->sessions_mu_);
        impl_->sessions_.erase(&stream_);
      }
      impl_->connections_.fetch_sub(1);
    }

    void Start() {
      asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
    }

   private:
    void Read() {
      parser_.emplace();
      parser_->header_limit(static_cast<uint32_t>(impl_->options_.max_request_bytes));
      parser_->body_limit(impl_->options_.max_request_bytes);
      stream_.expires_after(impl_->options_.request_timeout);
      http::async_read(stream_, buffer_, *parser_,
                       [self = shared_from_this()](boost::system::error_code ec, size_t) { self->OnRead(ec); });
    }

    void OnRead(boost::system::error_code ec) {
      if (ec) {
        const int status = ReadErrorStatus(ec);
        if (status == 0) return Close();
        // Answer, then drain what the client still sends for a moment before closing:
        // closing with unread input would reset the connection and could destroy the
        // answer before the client reads it.
        response_ = impl_->MakeResponse(
            HttpResponse::Text(status, absl::StrCat(ReasonPhrase(status), "\n")), 11, false, false);
        return Write(/*then_drain=*/true);
      }
      http::request<http::string_body> request = parser_->release();
      response_ = impl_->MakeResponse(impl_->Dispatch(request), request.version(), request.keep_alive(),
                                      request.method() == http::verb::head);
      Write(/*then_drain=*/false);
    }

    void Write(bool then_drain) {
      stream_.expires_after(impl_->options_.write_timeout);
      http::async_write(stream_, response_,
                        [self = shared_from_this(), then_drain](boost::system::error_code ec, size_t) {
                          self->OnWrite(ec, then_drain);
                        });
    }

    void OnWrite(boost::system::error_code ec, bool then_drain) {
      if (ec) return Close();
      if (then_drain) {
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        stream_.expires_after(std::chrono::seconds(1));
        return Drain();
      }
      if (!response_.keep_alive()) return Close();
      Read();
    }

    // Reads and discards input for up to a second (or 1 MiB) after our half-close.
    void Drain() {
      stream_.async_read_some(asio::buffer(scratch_),
                              [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                                self->drained_ += n;
                                if (ec || self->drained_ >= (1 << 20)) return self->Close();
                                self->Drain();
                              });
    }

    void Close() {
      boost::system::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      stream_.close();
    }

    Impl* const impl_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    http::response<http::string_body> response_;
    char scratch_[4096];
    size_t drained_ = 0;
  };

  // The answer to a request that could not be read: 413 when over a limit, 400 when
  // malformed, 0 (just close) for end of stream, timeouts and socket errors.
  static int ReadErrorStatus(const boost::system::error_code& error) {
    if (error == http::error::body_limit || error == http::error::header_limit ||
        error == http::error::buffer_overflow) {
      return 413;
    }
    const bool parse_error = &error.category() == &http::make_error_code(http::error::bad_method).category();
    if (parse_error && error != http::error::end_of_stream && error != http::error::partial_message) {
      return 400;
    }
    return 0;
  }

  // For HEAD, the Content-Length of the body that GET would send, and no body.
  http::response<http::string_body> MakeResponse(HttpResponse in, unsigned version, bool keep_alive,
                                                 bool head) {
    http::response<http::string_body> out{static_cast<http::status>(in.status), version};
    out.set(http::field::server, options_.server_name);
    out.set(http::field::content_type, in.content_type);
    for (auto& [name, value] : in.headers) out.insert(name, value);
    out.keep_alive(keep_alive);
    if (head) {
      out.content_length(in.body.size());
    } else {
      out.body() = std::move(in.body);
      out.prepare_payload();
    }
    return out;
  }

  HttpResponse Dispatch(const http::request<http::string_body>& raw) {
    HttpRequest request;
    request.method = std::string(raw.method_string());
    request.target = std::string(raw.target());
    std::string_view target = raw.target();
    size_t question = target.find('?');
    if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
    std::optional<std::string> path = DecodePath(target.substr(0, question));
    if (!path || path->empty() || path->front() != '/') return HttpResponse::Text(400, "bad request target\n");
    request.path = std::move(*path);
    for (const auto& field : raw) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    const bool method_ok = raw.method() == http::verb::get || raw.method() == http::verb::head;

    Handler handler;
    std::optional<StaticDirectory> static_dir;
    {
      std::shared_lock lock(routes_mu_);
      auto it = handlers_.find(request.path);
      if (it != handlers_.end()) {
        handler = it->second;
      } else {
        for (const auto& dir : static_dirs_) {
          if (request.path == dir.prefix || absl::StartsWith(request.path, dir.prefix + "/")) {
            static_dir = dir;
            break;
          }
        }
      }
    }
    if (!handler && !static_dir) return HttpResponse::Text(404, "not found\n");
    if (!method_ok) {
      HttpResponse response = HttpResponse::Text(405, "method not allowed\n");
      response.headers.emplace_back("Allow", "GET, HEAD");
      return response;
    }
    if (static_dir) return ServeStatic(*static_dir, request.path);
    try {
      return handler(request);
    } catch (const std::exception& e) {
      spdlog::error("admin server: handler for {} failed: {}", request.path, e.what());
    } catch (...) {
      spdlog::error("admin server: handler for {} failed", request.path);
    }
    return HttpResponse::Text(500, "internal error\n");
  }

  HttpResponse Metrics() const {
    HttpResponse response;
    response.content_type = "text/plain; version=0.0.4";
    if (metrics_) {
      std::ostringstream out;
      prometheus::TextSerializer().Serialize(out, metrics_->Collect());
      response.body = out.str();
    }
    return response;
  }

  static HttpResponse ServeStatic(const StaticDirectory& dir, const std::string& path) {
    if (path == dir.prefix && !dir.prefix.empty()) {
      // "/dashboard" -> "/dashboard/", so that the page's relative links resolve.
      HttpResponse response = HttpResponse::Text(301, "moved\n");
      response.headers.emplace_back("Location", dir.prefix + "/");
      return response;
    }
    const HttpResponse not_found = HttpResponse::Text(404, "not found\n");
    std::string relative = path.substr(dir.prefix.size() + 1);
    if (relative.empty() || relative.back() == '/') relative += "index.html";
    // Refuse any "." or ".." segment and backslashes outright, then check that the
    // resolved file (symlinks followed) is still under the root.
    for (std::string_view rest = relative; !rest.empty();) {
      size_t slash = rest.find('/');
      std::string_view segment = rest.substr(0, slash);
      if (segment == "." || segment == ".." || segment.find('\\') != std::string_view::npos) return not_found;
      if (slash == std::string_view::npos) break;
      rest.remove_prefix(slash + 1);
    }
    std::error_code ec;
    std::filesystem::path file = std::filesystem::weakly_canonical(dir.root / relative, ec);
    if (ec) return not_found;
    auto [root_end, file_it] = std::mismatch(dir.root.begin(), dir.root.end(), file.begin(), file.end());
    if (root_end != dir.root.end() || file_it == file.end()) return not_found;
    if (!std::filesystem::is_regular_file(file, ec)) return not_found;
    auto size = std::filesystem::file_size(file, ec);
    if (ec || size > kMaxStaticFileBytes) return not_found;
    std::ifstream in(file, std::ios::binary);
    std::string body(size, '\0');
    if (!in.read(body.data(), static_cast<std::streamsize>(size))) return not_found;
    HttpResponse response;
    response.content_type = ContentTypeFor(file);
    response.body = std::move(body);
    return response;
  }

  const std::shared_ptr<prometheus::Collectable> metrics_;
  const Options options_;
  std::atomic<bool> ready_{false};
  std::atomic<int> connections_{0};

  mutable std::shared_mutex routes_mu_;
  std::map<std::string, Handler> handlers_;
  std::vector<StaticDirectory> static_dirs_;

  std::mutex sessions_mu_;
  std::set<beast::tcp_stream*> sessions_;

  mutable std::mutex lifecycle_mu_;
  bool started_ = false;
  bool stopped_ = false;
  std::string bound_address_;
  uint16_t bound_port_ = 0;
  std::vector<std::thread> threads_;

  // Destroyed before the members above: destroying the io_context destroys the
  // sessions' coroutines, which use them. The acceptor goes first.
  asio::io_context ioc_;
  std::optional<tcp::acceptor> acceptor_;
  asio::steady_timer accept_backoff_{ioc_};
};

AdminServer::AdminServer(std::shared_ptr<prometheus::Collectable> metrics)
    : AdminServer(std::move(metrics), Options()) {}

AdminServer::AdminServer(std::shared_ptr<prometheus::Collectable> metrics, Options options)
    : impl_(std::make_unique<Impl>(std::move(metrics), std::move(options))) {}

AdminServer::~AdminServer() = default;

void AdminServer::AddHandler(std::string path, Handler handler) {
  impl_->AddHandler(std::move(path), std::move(handler));
}

absl::Status AdminServer::AddStaticDirectory(std::string url_prefix, const std::string& directory) {
  return impl_->AddStaticDirectory(std::move(url_prefix), directory);
}

absl::Status AdminServer::Start(const std::string& host_port) { return impl_->Start(host_port); }
std::string AdminServer::bound_address() const { return impl_->bound_address(); }
uint16_t AdminServer::bound_port() const { return impl_->bound_port(); }
void AdminServer::SetReady(bool ready) { impl_->SetReady(ready); }
bool AdminServer::ready() const { return impl_->ready(); }
void AdminServer::Stop() { impl_->Stop(); }

}  // namespace tandem::service
