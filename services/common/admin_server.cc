// Routing, built-in endpoints and static files; the HTTP transport (Boost.Beast) is in
// http_transport.cc.
#include "services/common/admin_server.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "services/common/http_transport.h"
#include "spdlog/spdlog.h"

namespace tandem::service {
namespace {

constexpr size_t kMaxStaticFileBytes = 64 << 20;

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
      const int hi = HexValue(raw[i + 1]);
      const int lo = HexValue(raw[i + 2]);
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
  std::string prefix;          // "/dashboard", or "" for the root
  std::filesystem::path root;  // canonical
};

HttpResponse ServeStatic(const StaticDirectory& dir, const std::string& path) {
  if (path == dir.prefix) {
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
    const size_t slash = rest.find('/');
    const std::string_view segment = rest.substr(0, slash);
    if (segment == "." || segment == ".." || segment.find('\\') != std::string_view::npos) {
      return not_found;
    }
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::weakly_canonical(dir.root / relative, ec);
  if (ec) return not_found;
  auto [root_end, file_rest] = std::mismatch(dir.root.begin(), dir.root.end(), file.begin(), file.end());
  if (root_end != dir.root.end() || file_rest == file.end()) return not_found;
  if (!std::filesystem::is_regular_file(file, ec)) return not_found;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec || size > kMaxStaticFileBytes) return not_found;
  std::ifstream in(file, std::ios::binary);
  std::string body(size, '\0');
  if (!in.read(body.data(), static_cast<std::streamsize>(size))) return not_found;
  HttpResponse response;
  response.content_type = ContentTypeFor(file);
  response.body = std::move(body);
  return response;
}

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
    std::stable_sort(static_dirs_.begin(), static_dirs_.end(),  // longest prefix first
                     [](const auto& a, const auto& b) { return a.prefix.size() > b.prefix.size(); });
    return absl::OkStatus();
  }

  absl::Status Start(const std::string& host_port) {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    if (transport_ != nullptr || stopped_) {
      return absl::FailedPreconditionError("admin server already started (or stopped)");
    }
    auto transport = internal::HttpTransport::Start(
        host_port, options_, [this](HttpRequest&& request) { return Dispatch(std::move(request)); },
        [](const std::string& error) { spdlog::warn("{}", error); });
    if (!transport.ok()) return transport.status();
    transport_ = std::move(*transport);
    return absl::OkStatus();
  }

  void Stop() {
    internal::HttpTransport* transport = nullptr;
    {
      // Not held while stopping: a handler still running may call bound_address().
      std::lock_guard<std::mutex> lock(lifecycle_mu_);
      stopped_ = true;
      transport = transport_.get();
    }
    if (transport != nullptr) transport->Stop();
  }

  std::string bound_address() const {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    return transport_ == nullptr ? "" : transport_->bound_address();
  }
  uint16_t bound_port() const {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    return transport_ == nullptr ? 0 : transport_->bound_port();
  }
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }

 private:
  HttpResponse Dispatch(HttpRequest&& request) {
    std::string_view target = request.target;
    const size_t question = target.find('?');
    if (question != std::string_view::npos) request.query = std::string(target.substr(question + 1));
    std::optional<std::string> path = DecodePath(target.substr(0, question));
    if (!path || path->empty() || path->front() != '/') return HttpResponse::Text(400, "bad request target\n");
    request.path = std::move(*path);

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
    if (request.method != "GET" && request.method != "HEAD") {
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

  const std::shared_ptr<prometheus::Collectable> metrics_;
  const Options options_;
  std::atomic<bool> ready_{false};

  mutable std::shared_mutex routes_mu_;
  std::map<std::string, Handler> handlers_;
  std::vector<StaticDirectory> static_dirs_;

  mutable std::mutex lifecycle_mu_;
  bool stopped_ = false;
  std::unique_ptr<internal::HttpTransport> transport_;
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
