// Boost.Beast lives here only: it dominates the compile time of services/common.
#include "services/common/http_transport.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

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

#include "absl/strings/str_cat.h"
#include "services/common/host_port.h"
#include "services/common/tcp_listen.h"

namespace tandem::service::internal {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

// The answer to a request that could not be read: 413 when over a limit, 400 when
// malformed, 0 (just close) for end of stream, timeouts and socket errors.
int ReadErrorStatus(const error_code& error) {
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

class BeastTransport;

// One connection: read a request, answer it, repeat while kept alive. Owned by the
// handler of its pending operation (shared_ptr); runs on its own strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(BeastTransport* transport, tcp::socket socket);
  ~Session();
  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }
  beast::tcp_stream& stream() { return stream_; }

 private:
  void Read();
  void OnRead(error_code ec);
  void Write(bool then_drain);
  void OnWrite(error_code ec, bool then_drain);
  void Drain();
  void Close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  BeastTransport* const transport_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  char scratch_[4096];
  size_t drained_ = 0;
};

class BeastTransport : public HttpTransport {
 public:
  BeastTransport(const AdminServer::Options& options, Dispatch dispatch, ErrorSink on_error)
      : options_(options), dispatch_(std::move(dispatch)), on_error_(std::move(on_error)) {}
  ~BeastTransport() override { Stop(); }

  absl::Status Listen(const std::string& host_port) {
    absl::StatusOr<tcp::acceptor> acceptor = ListenTcp(ioc_, host_port, "admin server");
    if (!acceptor.ok()) return acceptor.status();
    acceptor_.emplace(std::move(*acceptor));
    error_code ec;
    tcp::endpoint local = acceptor_->local_endpoint(ec);
    bound_address_ = FormatHostPort(local.address().to_string(), local.port());
    bound_port_ = local.port();
    Accept();
    for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { Run(); });
    return absl::OkStatus();
  }

  std::string bound_address() const override { return bound_address_; }
  uint16_t bound_port() const override { return bound_port_; }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    ioc_.stop();
    for (auto& thread : threads_) thread.join();
    threads_.clear();
    // Nothing runs now: close the listener and every connection. The sessions
    // themselves are destroyed with the io_context (their pending handlers own them).
    error_code ec;
    if (acceptor_) acceptor_->close(ec);
    std::lock_guard<std::mutex> sessions_lock(sessions_mu_);
    for (Session* session : sessions_) session->stream().socket().close(ec);
  }

 private:
  friend class Session;

  void Run() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {
        on_error_(absl::StrCat("admin server: ", e.what()));
      }
    }
  }

  void Accept() {
    acceptor_->async_accept(asio::make_strand(ioc_), [this](error_code ec, tcp::socket socket) {
      OnAccept(ec, std::move(socket));
    });
  }

  void OnAccept(error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    if (ec) {
      // Out of descriptors and the like: back off rather than spin.
      on_error_(absl::StrCat("admin server: accept failed: ", ec.message()));
      accept_backoff_.expires_after(std::chrono::milliseconds(50));
      accept_backoff_.async_wait([this](error_code) { Accept(); });
      return;
    }
    if (connections_.load() >= options_.max_connections) {
      socket.close(ec);
    } else {
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  }

  // A Beast response from the dispatcher's. For HEAD, the Content-Length of the body
  // that GET would send, and no body.
  http::response<http::string_body> MakeResponse(HttpResponse in, unsigned version, bool keep_alive,
                                                 bool head) const {
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

  HttpResponse Answer(const http::request<http::string_body>& raw) const {
    HttpRequest request;
    request.method = std::string(raw.method_string());
    request.target = std::string(raw.target());
    for (const auto& field : raw) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    return dispatch_(std::move(request));
  }

  const AdminServer::Options options_;
  const Dispatch dispatch_;
  const ErrorSink on_error_;
  std::atomic<int> connections_{0};
  std::mutex sessions_mu_;
  std::set<Session*> sessions_;
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::string bound_address_;
  uint16_t bound_port_ = 0;
  std::vector<std::thread> threads_;
  // Destroyed before the members above, acceptor and timer first: destroying the
  // io_context destroys the pending handlers and with them the sessions, which use
  // the members above.
  asio::io_context ioc_;
  std::optional<tcp::acceptor> acceptor_;
  asio::steady_timer accept_backoff_{ioc_};
};

Session::Session(BeastTransport* transport, tcp::socket socket)
    : transport_(transport), stream_(std::move(socket)) {
  transport_->connections_.fetch_add(1);
  std::lock_guard<std::mutex> lock(transport_->sessions_mu_);
  transport_->sessions_.insert(this);
}

Session::~Session() {
  {
    std::lock_guard<std::mutex> lock(transport_->sessions_mu_);
    transport_->sessions_.erase(this);
  }
  transport_->connections_.fetch_sub(1);
}

void Session::Read() {
  const AdminServer::Options& options = transport_->options_;
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(options.max_request_bytes));
  parser_->body_limit(options.max_request_bytes);
  stream_.expires_after(options.request_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](error_code ec, size_t) { self->OnRead(ec); });
}

void Session::OnRead(error_code ec) {
  if (ec) {
    const int status = ReadErrorStatus(ec);
    if (status == 0) return Close();
    // Answer, then drain what the client still sends for a moment before closing:
    // closing with unread input would reset the connection and could destroy the
    // answer before the client reads it.
    response_ = transport_->MakeResponse(
        HttpResponse::Text(status, status == 413 ? "request too large\n" : "bad request\n"), 11,
        /*keep_alive=*/false, /*head=*/false);
    return Write(/*then_drain=*/true);
  }
  http::request<http::string_body> request = parser_->release();
  response_ = transport_->MakeResponse(transport_->Answer(request), request.version(),
                                       request.keep_alive(), request.method() == http::verb::head);
  Write(/*then_drain=*/false);
}

void Session::Write(bool then_drain) {
  stream_.expires_after(transport_->options_.write_timeout);
  http::async_write(stream_, response_, [self = shared_from_this(), then_drain](error_code ec, size_t) {
    self->OnWrite(ec, then_drain);
  });
}

void Session::OnWrite(error_code ec, bool then_drain) {
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
void Session::Drain() {
  stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](error_code ec, size_t n) {
    self->drained_ += n;
    if (ec || self->drained_ >= (1 << 20)) return self->Close();
    self->Drain();
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Start(const std::string& host_port,
                                                                     const AdminServer::Options& options,
                                                                     Dispatch dispatch, ErrorSink on_error) {
  auto transport = std::make_unique<BeastTransport>(options, std::move(dispatch), std::move(on_error));
  absl::Status status = transport->Listen(host_port);
  if (!status.ok()) return status;
  return std::unique_ptr<HttpTransport>(std::move(transport));
}

}  // namespace tandem::service::internal
