// Boost.Beast lives here only (it dominates compile time).
#include "services/http/http_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "services/common/host_port.h"
#include "services/common/tcp_listen.h"

namespace tandem::http {

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return {};
}

std::string_view Request::Path() const {
  std::string_view t = target;
  const size_t q = t.find('?');
  return q == std::string_view::npos ? t : t.substr(0, q);
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
// HTTPS: TLS over the same TCP stream (its timeouts apply to the TLS records).
using TlsStream = asio::ssl::stream<beast::tcp_stream>;
template <class Stream>
constexpr bool kIsTls = std::is_same_v<Stream, TlsStream>;
beast::tcp_stream& Tcp(beast::tcp_stream& s) { return s; }
beast::tcp_stream& Tcp(TlsStream& s) { return s.next_layer(); }

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

// Header values from handlers go out as given: refuse what would split the response.
bool SafeHeader(const std::string& s) { return s.find_first_of("\r\n") == std::string::npos; }

// Whether the server is still there to post to: an Exchange may outlive it.
struct Gate {
  std::mutex mu;
  bool open = true;
};

class BeastServer;

// What the server needs of a connection of either kind.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void CloseFromStop() = 0;
};

// One connection: plain HTTP (Stream = beast::tcp_stream) or HTTPS (TlsStream, whose
// handshake comes first and whose end sends TLS close_notify).
template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(BeastServer* server, Stream stream);
  ~Session() override;
  void Start();
  void CloseFromStop() override {
    error_code ec;
    Tcp(stream_).socket().close(ec);
  }

  // Exchange operations, on the strand; `seq` names the request they answer.
  void DoRespond(uint64_t seq, int status, std::string content_type, std::string body, Headers headers);
  void DoStartStream(uint64_t seq, int status, std::string content_type, Headers headers);
  void DoSend(uint64_t seq, std::string data);
  void DoEndStream(uint64_t seq);
  void DoSetHandlers(uint64_t seq, std::function<void()> on_gone, std::function<void()> on_writable);
  void DoAbandoned(uint64_t seq);

  auto executor() { return stream_.get_executor(); }
  // Bytes accepted by Send and not yet written (read by Send on any thread).
  std::atomic<size_t> backlog{0};
  std::atomic<bool> told_full{false};

 private:
  enum class Phase { kReading, kHandling, kStreaming, kFinishing, kClosed };

  void Read();
  void OnRead(error_code ec);
  void Watch();
  void OnWatch(error_code ec, size_t n);
  void Queue(std::string bytes);
  void WriteNext();
  void OnWritten(error_code ec, size_t n);
  void Done();  // the answer is out: next request or close
  void Gone();
  void Close();
  void Drain();
  void Shutdown();  // TLS: close_notify, then close
  void ErrorAnswer(int status, const char* text);
  std::string Head(int status, const std::string& content_type, const Headers& headers, bool chunked,
                   size_t length) const;

  BeastServer* const server_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::kReading;
  uint64_t seq_ = 0;  // the request being answered
  bool keep_alive_ = false;
  bool head_only_ = false;
  bool answered_ = false;  // Respond or StartStream called for seq_
  bool end_queued_ = false;
  bool watching_ = false;
  bool read_after_watch_ = false;
  bool writing_ = false;
  bool gone_told_ = false;
  std::deque<std::string> out_;
  std::function<void()> on_gone_;
  std::function<void()> on_writable_;
  char watch_buf_[4096];
  size_t drained_ = 0;
};

template <class Session>
class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(std::weak_ptr<Session> session, std::shared_ptr<Gate> gate, uint64_t seq, size_t high_water)
      : session_(std::move(session)), gate_(std::move(gate)), seq_(seq), high_water_(high_water) {}
  ~ExchangeImpl() override {
    Post([seq = seq_](Session& s) { s.DoAbandoned(seq); });
  }
  void Respond(int status, std::string content_type, std::string body, Headers headers) override {
    Post([=, seq = seq_, ct = std::move(content_type), b = std::move(body), h = std::move(headers)](Session& s) mutable {
      s.DoRespond(seq, status, std::move(ct), std::move(b), std::move(h));
    });
  }
  void StartStream(int status, std::string content_type, Headers headers) override {
    Post([=, seq = seq_, ct = std::move(content_type), h = std::move(headers)](Session& s) mutable {
      s.DoStartStream(seq, status, std::move(ct), std::move(h));
    });
  }
  bool Send(std::string data) override {
    std::shared_ptr<Session> s = session_.lock();
    if (!s) return false;
    const size_t after = s->backlog.fetch_add(data.size()) + data.size();
    const bool more = after <= high_water_;
    if (!more) s->told_full.store(true);
    Post([seq = seq_, d = std::move(data)](Session& session) mutable { session.DoSend(seq, std::move(d)); });
    return more;
  }
  void EndStream() override {
    Post([seq = seq_](Session& s) { s.DoEndStream(seq); });
  }
  void SetHandlers(std::function<void()> on_gone, std::function<void()> on_writable) override {
    Post([seq = seq_, g = std::move(on_gone), w = std::move(on_writable)](Session& s) mutable {
      s.DoSetHandlers(seq, std::move(g), std::move(w));
    });
  }

 private:
  template <typename F>
  void Post(F&& f) {
    std::lock_guard<std::mutex> lock(gate_->mu);
    if (!gate_->open) return;
    std::shared_ptr<Session> s = session_.lock();
    if (!s) return;
    auto executor = s->executor();
    asio::post(executor, [s = std::move(s), f = std::forward<F>(f)]() mutable { f(*s); });
  }

  std::weak_ptr<Session> session_;
  std::shared_ptr<Gate> gate_;
  const uint64_t seq_;
  const size_t high_water_;
};

class BeastServer : public Server {
 public:
  BeastServer(const ServerOptions& options, Handler handler, ErrorSink on_error)
      : options_(options), handler_(std::move(handler)), on_error_(std::move(on_error)) {}

  // HTTPS with the PEM certificate chain and key files of options_; INVALID_ARGUMENT
  // naming the file that cannot be used.
  absl::Status LoadTls() {
    if (options_.tls_cert_file.empty() && options_.tls_key_file.empty()) return absl::OkStatus();
    if (options_.tls_cert_file.empty() || options_.tls_key_file.empty()) {
      return absl::InvalidArgumentError("HTTPS needs both a certificate and a key file");
    }
    tls_.emplace(asio::ssl::context::tls_server);
    error_code ec;
    tls_->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                          asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                          asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use,
                      ec);
    if (!ec) tls_->use_certificate_chain_file(options_.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot use the TLS certificate ", options_.tls_cert_file, ": ", ec.message()));
    }
    tls_->use_private_key_file(options_.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot use the TLS key ", options_.tls_key_file, ": ", ec.message()));
    }
    if (SSL_CTX_check_private_key(tls_->native_handle()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("the TLS key ", options_.tls_key_file,
                                                     " does not belong to the certificate ", options_.tls_cert_file));
    }
    return absl::OkStatus();
  }
  ~BeastServer() override { Stop(); }

  absl::Status Listen(const std::string& host_port) {
    absl::StatusOr<tcp::acceptor> acceptor = service::ListenTcp(ioc_, host_port, "http");
    if (!acceptor.ok()) return acceptor.status();
    acceptor_.emplace(std::move(*acceptor));
    error_code ec;
    tcp::endpoint local = acceptor_->local_endpoint(ec);
    bound_address_ = service::FormatHostPort(local.address().to_string(), local.port());
    bound_port_ = local.port();
    Accept();
    for (int i = 0; i < std::max(1, options_.threads); ++i) threads_.emplace_back([this] { Run(); });
    return absl::OkStatus();
  }

  std::string bound_address() const override { return bound_address_; }
  uint16_t bound_port() const override { return bound_port_; }
  int connections() const override { return connections_.load(); }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    {
      std::lock_guard<std::mutex> gate_lock(gate_->mu);
      gate_->open = false;
    }
    ioc_.stop();
    for (auto& thread : threads_) thread.join();
    threads_.clear();
    error_code ec;
    if (acceptor_) acceptor_->close(ec);
    std::lock_guard<std::mutex> sessions_lock(sessions_mu_);
    for (SessionBase* session : sessions_) session->CloseFromStop();
  }

 private:
  template <class Stream>
  friend class Session;

  void Run() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {
        on_error_(absl::StrCat("http: ", e.what()));
      }
    }
  }

  void Accept() {
    acceptor_->async_accept(asio::make_strand(ioc_),
                            [this](error_code ec, tcp::socket socket) { OnAccept(ec, std::move(socket)); });
  }

  void OnAccept(error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    if (ec) {
      on_error_(absl::StrCat("http: accept failed: ", ec.message()));
      accept_backoff_.expires_after(std::chrono::milliseconds(50));
      accept_backoff_.async_wait([this](error_code) { Accept(); });
      return;
    }
    if (connections_.load() >= options_.max_connections) {
      // Over the limit: a short answer rather than a silent reset, then close.
      static const std::string kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
          "Retry-After: 1\r\nContent-Length: 96\r\n\r\n"
          "{\"error\":{\"message\":\"too many connections\",\"type\":\"service_unavailable\",\"param\":null,\"code\":503}}";
      error_code ignored;
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(kBusy), ignored);
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    } else {
      if (tls_) {
        std::make_shared<Session<TlsStream>>(this, TlsStream(beast::tcp_stream(std::move(socket)), *tls_))->Start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(this, beast::tcp_stream(std::move(socket)))->Start();
      }
    }
    Accept();
  }

  const ServerOptions options_;
  const Handler handler_;
  const ErrorSink on_error_;
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  std::atomic<int> connections_{0};
  std::mutex sessions_mu_;
  std::set<SessionBase*> sessions_;
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::string bound_address_;
  uint16_t bound_port_ = 0;
  std::vector<std::thread> threads_;
  asio::io_context ioc_;
  std::optional<tcp::acceptor> acceptor_;
  asio::steady_timer accept_backoff_{ioc_};
  std::optional<asio::ssl::context> tls_;
};

template <class Stream>
Session<Stream>::Session(BeastServer* server, Stream stream) : server_(server), stream_(std::move(stream)) {
  // Streamed answers are many small writes: with Nagle's algorithm each one after the
  // first waits for the client's (delayed, up to 40 ms) ACK of the one before.
  error_code ignored;
  Tcp(stream_).socket().set_option(tcp::no_delay(true), ignored);
  server_->connections_.fetch_add(1);
  std::lock_guard<std::mutex> lock(server_->sessions_mu_);
  server_->sessions_.insert(this);
}

template <class Stream>
void Session<Stream>::Start() {
  asio::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
    if constexpr (kIsTls<Stream>) {
      // The handshake counts against the first request's read timeout.
      Tcp(self->stream_).expires_after(self->server_->options_.read_timeout);
      self->stream_.async_handshake(asio::ssl::stream_base::server, [self](error_code ec) {
        if (ec) return self->Close();  // not TLS, or a client that does not trust us
        self->Read();
      });
    } else {
      self->Read();
    }
  });
}

template <class Stream>
Session<Stream>::~Session() {
  if (on_gone_ && !gone_told_ && phase_ != Phase::kReading) on_gone_();
  {
    std::lock_guard<std::mutex> lock(server_->sessions_mu_);
    server_->sessions_.erase(this);
  }
  server_->connections_.fetch_sub(1);
}

template <class Stream>
void Session<Stream>::Read() {
  phase_ = Phase::kReading;
  answered_ = end_queued_ = false;
  on_gone_ = nullptr;
  on_writable_ = nullptr;
  backlog.store(0);
  told_full.store(false);
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(server_->options_.max_header_bytes));
  parser_->body_limit(server_->options_.max_body_bytes);
  Tcp(stream_).expires_after(seq_ == 0 ? server_->options_.read_timeout
                                       : server_->options_.idle_timeout + server_->options_.read_timeout);
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = this->shared_from_this()](error_code ec, size_t) { self->OnRead(ec); });
}

template <class Stream>
void Session<Stream>::OnRead(error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (ec == bhttp::error::body_limit) return ErrorAnswer(413, "request body too large");
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
      return ErrorAnswer(431, "request headers too large");
    }
    if (ec == beast::error::timeout) {
      if (parser_->got_some()) return ErrorAnswer(408, "request not received in time");
      return Close();
    }
    const bool parse_error = &ec.category() == &bhttp::make_error_code(bhttp::error::bad_method).category();
    if (parse_error && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      return ErrorAnswer(400, "malformed HTTP request");
    }
    return Close();
  }
  Tcp(stream_).expires_never();
  bhttp::request<bhttp::string_body> raw = parser_->release();
  ++seq_;
  keep_alive_ = raw.keep_alive();
  head_only_ = raw.method() == bhttp::verb::head;
  phase_ = Phase::kHandling;
  Request request;
  request.method = std::string(raw.method_string());
  request.target = std::string(raw.target());
  for (const auto& field : raw) request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  request.body = std::move(raw.body());
  error_code ignored;
  const tcp::endpoint peer = Tcp(stream_).socket().remote_endpoint(ignored);
  request.peer = service::FormatHostPort(peer.address().to_string(), peer.port());
  Watch();
  auto exchange = std::make_shared<ExchangeImpl<Session>>(this->weak_from_this(), server_->gate_, seq_,
                                                          server_->options_.high_water_bytes);
  server_->handler_(std::move(request), std::move(exchange));
}

// While an answer is being computed, a read on the socket learns that the client went
// away (end of stream or reset). Bytes of a pipelined next request are kept for it.
template <class Stream>
void Session<Stream>::Watch() {
  watching_ = true;
  auto on_read = [self = this->shared_from_this()](error_code ec, size_t n) { self->OnWatch(ec, n); };
  if constexpr (kIsTls<Stream>) {
    stream_.async_read_some(asio::buffer(watch_buf_), std::move(on_read));  // through TLS: whole records
  } else {
    Tcp(stream_).socket().async_read_some(asio::buffer(watch_buf_), std::move(on_read));
  }
}

template <class Stream>
void Session<Stream>::OnWatch(error_code ec, size_t n) {
  watching_ = false;
  if (phase_ == Phase::kClosed) return;
  if (read_after_watch_) {
    read_after_watch_ = false;
    if (!ec && n > 0) {
      auto dst = buffer_.prepare(n);
      std::memcpy(dst.data(), watch_buf_, n);
      buffer_.commit(n);
    }
    if (ec && ec != asio::error::operation_aborted) return Close();
    return Read();
  }
  if (phase_ == Phase::kFinishing && end_queued_ && !writing_ && out_.empty()) {
    // The answer is out and the connection closes: this read was the drain.
    if constexpr (kIsTls<Stream>) return Shutdown();
    if (ec) return Close();
    Tcp(stream_).expires_after(std::chrono::seconds(1));
    return Drain();
  }
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    return Gone();
  }
  if (buffer_.size() + n > server_->options_.max_header_bytes + server_->options_.max_body_bytes) return Close();
  auto dst = buffer_.prepare(n);
  std::memcpy(dst.data(), watch_buf_, n);
  buffer_.commit(n);
  Watch();
}

template <class Stream>
std::string Session<Stream>::Head(int status, const std::string& content_type, const Headers& headers, bool chunked,
                          size_t length) const {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\nServer: ",
                                  server_->options_.server_name, "\r\n");
  if (!content_type.empty() && SafeHeader(content_type)) absl::StrAppend(&head, "Content-Type: ", content_type, "\r\n");
  for (const auto& [name, value] : headers) {
    if (SafeHeader(name) && SafeHeader(value) && !name.empty()) absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  if (chunked) {
    absl::StrAppend(&head, "Transfer-Encoding: chunked\r\n");
  } else {
    absl::StrAppend(&head, "Content-Length: ", length, "\r\n");
  }
  absl::StrAppend(&head, keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n", "\r\n");
  return head;
}

template <class Stream>
void Session<Stream>::DoRespond(uint64_t seq, int status, std::string content_type, std::string body, Headers headers) {
  if (seq != seq_ || answered_ || phase_ != Phase::kHandling) return;
  answered_ = true;
  end_queued_ = true;
  phase_ = Phase::kFinishing;
  const size_t length = body.size();
  std::string bytes = Head(status, content_type, headers, /*chunked=*/false, length);
  if (!head_only_) bytes += body;
  Queue(std::move(bytes));
}

template <class Stream>
void Session<Stream>::DoStartStream(uint64_t seq, int status, std::string content_type, Headers headers) {
  if (seq != seq_ || answered_ || phase_ != Phase::kHandling) return;
  answered_ = true;
  phase_ = Phase::kStreaming;
  Queue(Head(status, content_type, headers, /*chunked=*/true, 0));
}

template <class Stream>
void Session<Stream>::DoSend(uint64_t seq, std::string data) {
  const size_t size = data.size();
  if (seq != seq_ || phase_ != Phase::kStreaming || data.empty()) {
    if (seq == seq_) backlog.fetch_sub(std::min(size, backlog.load()));
    return;
  }
  // The backlog counted the payload; the chunk framing is extra and not counted.
  out_.push_back(absl::StrFormat("%x\r\n", size) + std::move(data) + "\r\n");
  WriteNext();
}

template <class Stream>
void Session<Stream>::DoEndStream(uint64_t seq) {
  if (seq != seq_ || phase_ != Phase::kStreaming) return;
  phase_ = Phase::kFinishing;
  end_queued_ = true;
  Queue("0\r\n\r\n");
}

template <class Stream>
void Session<Stream>::DoSetHandlers(uint64_t seq, std::function<void()> on_gone, std::function<void()> on_writable) {
  if (seq != seq_) return;
  on_gone_ = std::move(on_gone);
  on_writable_ = std::move(on_writable);
  if (gone_told_ && on_gone_) {
    auto f = std::move(on_gone_);
    f();
  }
}

template <class Stream>
void Session<Stream>::DoAbandoned(uint64_t seq) {
  if (seq != seq_) return;
  if (phase_ == Phase::kHandling && !answered_) {
    DoRespond(seq, 500, "application/json",
              "{\"error\":{\"message\":\"internal error: the request was dropped without an answer\","
              "\"type\":\"internal_error\",\"param\":null,\"code\":500}}",
              {});
  } else if (phase_ == Phase::kStreaming) {
    // A stream whose producer went away without ending it: end it, so the client is not
    // left waiting (its last event says why, if the producer sent one).
    DoEndStream(seq);
  }
}

template <class Stream>
void Session<Stream>::Queue(std::string bytes) {
  out_.push_back(std::move(bytes));
  WriteNext();
}

template <class Stream>
void Session<Stream>::WriteNext() {
  if (writing_ || out_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  Tcp(stream_).expires_after(server_->options_.write_timeout);
  // Gather what is queued into one write (SSE events are small).
  while (out_.size() > 1 && out_.front().size() < (64 << 10)) {
    std::string next = std::move(out_[1]);
    out_.erase(out_.begin() + 1);
    out_.front() += next;
  }
  asio::async_write(stream_, asio::buffer(out_.front()),
                    [self = this->shared_from_this()](error_code ec, size_t n) { self->OnWritten(ec, n); });
}

template <class Stream>
void Session<Stream>::OnWritten(error_code ec, size_t n) {
  writing_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) return Gone();
  out_.pop_front();
  Tcp(stream_).expires_never();
  // The backlog counts payload bytes (approximately: framing included here).
  const size_t before = backlog.load();
  backlog.store(before > n ? before - n : 0);
  if (!out_.empty()) return WriteNext();
  if (told_full.load() && backlog.load() <= server_->options_.low_water_bytes) {
    told_full.store(false);
    if (on_writable_) on_writable_();
  }
  if (end_queued_) Done();
}

template <class Stream>
void Session<Stream>::Done() {
  on_gone_ = nullptr;
  on_writable_ = nullptr;
  if (!keep_alive_ && kIsTls<Stream>) {
    // TLS ends with close_notify (clients treat a bare TCP close as truncation); a watch
    // read in flight is stopped first, and its handler shuts down.
    phase_ = Phase::kFinishing;
    if (!watching_) return Shutdown();
    error_code ignored;
    Tcp(stream_).socket().cancel(ignored);
    return;
  }
  if (!keep_alive_) {
    // Half-close, then read what the client still sends for a moment: closing with
    // unread input resets the connection and can destroy the answer before it is read.
    error_code ignored;
    Tcp(stream_).socket().shutdown(tcp::socket::shutdown_send, ignored);
    phase_ = Phase::kFinishing;
    if (watching_) return;  // the watch read drains (OnWatch sees end_queued_)
    Tcp(stream_).expires_after(std::chrono::seconds(1));
    return Drain();
  }
  if (watching_) {
    // Stop the watch read; its handler starts the next read.
    read_after_watch_ = true;
    phase_ = Phase::kReading;
    error_code ignored;
    Tcp(stream_).socket().cancel(ignored);
    return;
  }
  Read();
}

template <class Stream>
void Session<Stream>::Drain() {
  stream_.async_read_some(asio::buffer(watch_buf_), [self = this->shared_from_this()](error_code ec, size_t n) {
    self->drained_ += n;
    if (ec || self->drained_ >= (1 << 20)) return self->Close();
    self->Drain();
  });
}

template <class Stream>
void Session<Stream>::Shutdown() {
  if constexpr (kIsTls<Stream>) {
    Tcp(stream_).expires_after(std::chrono::seconds(1));
    stream_.async_shutdown([self = this->shared_from_this()](error_code) { self->Close(); });
  } else {
    Close();
  }
}

template <class Stream>
void Session<Stream>::Gone() {
  if (!gone_told_) {
    gone_told_ = true;
    if (on_gone_) {
      auto f = std::move(on_gone_);
      f();
    }
  }
  Close();
}

template <class Stream>
void Session<Stream>::Close() {
  if (phase_ == Phase::kClosed) return;
  const bool answering = phase_ == Phase::kHandling || phase_ == Phase::kStreaming;
  phase_ = Phase::kClosed;
  Tcp(stream_).close();
  if (answering && !gone_told_) {
    gone_told_ = true;
    if (on_gone_) {
      auto f = std::move(on_gone_);
      f();
    }
  }
}

template <class Stream>
void Session<Stream>::ErrorAnswer(int status, const char* text) {
  keep_alive_ = false;
  phase_ = Phase::kFinishing;
  end_queued_ = true;
  const std::string body = absl::StrCat("{\"error\":{\"message\":\"", text, "\",\"type\":\"invalid_request_error\",",
                                        "\"param\":null,\"code\":", status, "}}");
  Queue(Head(status, "application/json", {}, /*chunked=*/false, body.size()) + body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const std::string& host_port, const ServerOptions& options,
                                                      Handler handler, ErrorSink on_error) {
  auto server = std::make_unique<BeastServer>(options, std::move(handler), std::move(on_error));
  if (absl::Status s = server->LoadTls(); !s.ok()) return s;
  if (absl::Status s = server->Listen(host_port); !s.ok()) return s;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace tandem::http
