// Boost.Beast lives here only (it dominates compile time).
#include "cli/bench/http_client.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace tandem::cli {

absl::StatusOr<HttpBaseUrl> ParseHttpBaseUrl(const std::string& url) {
  absl::string_view rest = url;
  if (absl::StartsWithIgnoreCase(rest, "https://")) {
    return absl::UnimplementedError(absl::StrCat("--base-url ", url, ": https is not supported by tandem bench (plain http only)"));
  }
  if (!absl::StartsWithIgnoreCase(rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("--base-url ", url, ": expected http://HOST[:PORT][/PATH]"));
  }
  rest.remove_prefix(7);
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? absl::string_view() : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  HttpBaseUrl out;
  out.path = std::string(path);
  absl::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return absl::InvalidArgumentError(absl::StrCat("--base-url ", url, ": unclosed '['"));
    out.host = std::string(authority.substr(1, close - 1));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return absl::InvalidArgumentError(absl::StrCat("--base-url ", url, ": bad address"));
      port = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
  }
  if (out.host.empty()) return absl::InvalidArgumentError(absl::StrCat("--base-url ", url, ": no host"));
  if (!port.empty()) {
    int p = 0;
    if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--base-url ", url, ": bad port '", std::string(port), "'"));
    }
    out.port = static_cast<uint16_t>(p);
  }
  return out;
}

absl::StatusOr<HttpWholeResponse> HttpClient::Fetch(std::string method, std::string target, HttpHeaders headers,
                                                    std::string body, double timeout_s) {
  auto whole = std::make_shared<HttpWholeResponse>();
  auto finished = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = finished->get_future();
  HttpResponseHandlers h;
  h.on_head = [whole](int status, const HttpHeaders&) { whole->status = status; };
  h.on_body = [whole](std::string_view bytes, HttpClock::time_point) { whole->body.append(bytes); };
  h.on_done = [finished](const absl::Status& s) { finished->set_value(s); };
  const auto deadline = HttpClock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  Send(std::move(method), std::move(target), std::move(headers), std::move(body), deadline, std::move(h));
  absl::Status s = result.get();
  if (!s.ok()) return s;
  return std::move(*whole);
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

struct Pending {
  bhttp::request<bhttp::string_body> request;
  HttpClock::time_point deadline;
  HttpResponseHandlers handlers;
  bool resent = false;  // sent again on a new connection already
};

class BeastClient;

// One kept-alive connection; its operations run on its strand, one request at a time.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(BeastClient* client, asio::any_io_executor strand) : client_(client), stream_(strand) {}

  asio::any_io_executor executor() { return stream_.get_executor(); }

  void Run(std::unique_ptr<Pending> p) {
    pending_ = std::move(p);
    stream_.expires_at(pending_->deadline);
    if (connected_) return Write();
    Connect();
  }

 private:
  void Connect();
  void Write() {
    reused_ = requests_ > 0;
    ++requests_;
    bhttp::async_write(stream_, pending_->request,
                       [self = shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); });
  }
  void OnWritten(error_code ec) {
    if (ec) return Fail(ec, /*nothing_received=*/true);
    parser_.emplace();
    parser_->body_limit(boost::none);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
  }
  void OnHeader(error_code ec) {
    if (ec) return Fail(ec, /*nothing_received=*/!parser_->got_some());
    HttpHeaders headers;
    for (const auto& field : parser_->get()) {
      headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    if (pending_->handlers.on_head) pending_->handlers.on_head(parser_->get().result_int(), headers);
    ReadBody();
  }
  void ReadBody() {
    if (parser_->is_done()) return Finish();
    parser_->get().body().data = body_;
    parser_->get().body().size = sizeof body_;
    // read_some, not read: it completes as soon as the parser made progress, so each
    // event is handed over when it arrives.
    bhttp::async_read_some(stream_, buffer_, *parser_,
                           [self = shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
  }
  void OnBody(error_code ec) {
    const auto at = HttpClock::now();
    if (ec == bhttp::error::need_buffer) ec = {};
    const size_t got = sizeof body_ - parser_->get().body().size;
    if (got > 0 && pending_->handlers.on_body) pending_->handlers.on_body(std::string_view(body_, got), at);
    if (ec) return Fail(ec, /*nothing_received=*/false);
    ReadBody();
  }
  void Finish();
  void Fail(error_code ec, bool nothing_received);

  BeastClient* const client_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_;
  std::unique_ptr<Pending> pending_;
  bool connected_ = false;
  bool reused_ = false;
  int requests_ = 0;
  char body_[16 << 10];
};

class BeastClient : public HttpClient {
 public:
  BeastClient(tcp::resolver::results_type endpoints, std::string host_header, int threads)
      : endpoints_(std::move(endpoints)), host_header_(std::move(host_header)) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { ioc_.run(); });
  }
  ~BeastClient() override {
    work_.reset();
    ioc_.stop();
    for (auto& t : threads_) t.join();
    std::lock_guard<std::mutex> lock(mu_);
    idle_.clear();
  }

  void Send(std::string method, std::string target, HttpHeaders headers, std::string body,
            HttpClock::time_point deadline, HttpResponseHandlers handlers) override {
    auto p = std::make_unique<Pending>();
    bhttp::request<bhttp::string_body>& r = p->request;
    r.version(11);
    r.method_string(method);
    r.target(target);
    r.set(bhttp::field::host, host_header_);
    r.set(bhttp::field::user_agent, "tandem-bench");
    for (auto& [name, value] : headers) r.set(name, value);
    r.keep_alive(true);
    const bool has_body = !body.empty() || method == "POST";
    r.body() = std::move(body);
    if (has_body) r.prepare_payload();
    p->deadline = deadline;
    p->handlers = std::move(handlers);
    Dispatch(std::move(p), /*fresh=*/false);
  }

  int connections_opened() const override { return opened_.load(); }

  // Runs `p` on an idle connection (unless `fresh`) or a new one.
  void Dispatch(std::unique_ptr<Pending> p, bool fresh) {
    std::shared_ptr<Connection> c;
    if (!fresh) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        c = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (!c) c = std::make_shared<Connection>(this, asio::make_strand(ioc_));
    asio::any_io_executor strand = c->executor();
    asio::dispatch(strand, [c = std::move(c), p = std::move(p)]() mutable { c->Run(std::move(p)); });
  }

  void Release(std::shared_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(c));
  }

  const tcp::resolver::results_type& endpoints() const { return endpoints_; }
  void CountOpened() { opened_.fetch_add(1); }

 private:
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(ioc_);
  const tcp::resolver::results_type endpoints_;
  const std::string host_header_;
  std::atomic<int> opened_{0};
  std::mutex mu_;
  std::vector<std::shared_ptr<Connection>> idle_;  // destroyed before ioc_
  std::vector<std::thread> threads_;
};

void Connection::Connect() {
  client_->CountOpened();
  stream_.async_connect(client_->endpoints(), [self = shared_from_this()](error_code ec, const tcp::endpoint&) {
    if (ec) return self->Fail(ec, /*nothing_received=*/true);
    self->connected_ = true;
    self->requests_ = 0;
    error_code ignored;
    self->stream_.socket().set_option(tcp::no_delay(true), ignored);
    self->Write();
  });
}

void Connection::Finish() {
  const bool keep = parser_->keep_alive();
  stream_.expires_never();
  std::unique_ptr<Pending> done = std::move(pending_);
  parser_.reset();
  // Idle before on_done runs: the request that on_done makes room for can take it.
  if (keep) {
    client_->Release(shared_from_this());
  } else {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    connected_ = false;
  }
  if (done->handlers.on_done) done->handlers.on_done(absl::OkStatus());
}

void Connection::Fail(error_code ec, bool nothing_received) {
  stream_.close();
  connected_ = false;
  std::unique_ptr<Pending> p = std::move(pending_);
  parser_.reset();
  buffer_.clear();
  // A kept-alive connection the server closed while it was idle: it read none of this
  // request, which goes again, once, on a new connection.
  const bool closed_while_idle = ec == asio::error::eof || ec == bhttp::error::end_of_stream ||
                                 ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
  if (reused_ && nothing_received && closed_while_idle && !p->resent) {
    p->resent = true;
    return client_->Dispatch(std::move(p), /*fresh=*/true);
  }
  const absl::Status s = ec == beast::error::timeout
                             ? absl::DeadlineExceededError("HTTP request timed out")
                             : absl::UnavailableError(absl::StrCat("HTTP connection failed: ", ec.message()));
  if (p->handlers.on_done) p->handlers.on_done(s);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpClient>> HttpClient::Create(const HttpBaseUrl& url, int threads) {
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  error_code ec;
  tcp::resolver::results_type endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
  if (ec || endpoints.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", url.host, ": ", ec ? ec.message() : "no address"));
  }
  const bool v6 = url.host.find(':') != std::string::npos;
  std::string host_header = v6 ? absl::StrCat("[", url.host, "]:", url.port) : absl::StrCat(url.host, ":", url.port);
  return std::unique_ptr<HttpClient>(new BeastClient(std::move(endpoints), std::move(host_header), threads));
}

}  // namespace tandem::cli
