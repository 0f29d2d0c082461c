#include "services/common/admin_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem::service {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A plain blocking POSIX client socket to 127.0.0.1:port, with a receive timeout.
class Client {
 public:
  explicit Client(uint16_t port, int timeout_ms = 5000) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  bool Send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n = send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Everything until the server closes (or the timeout).
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  // One response framed by Content-Length (keep-alive), or "" on timeout/close.
  std::string ReadResponse(bool head = false) {
    while (true) {
      size_t end = pending_.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t length = 0;
        std::string headers = pending_.substr(0, end);
        std::string lower = headers;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        size_t cl = lower.find("content-length:");
        if (cl != std::string::npos) length = std::stoul(headers.substr(cl + 15));
        if (head) length = 0;
        if (pending_.size() >= end + 4 + length) {
          std::string response = pending_.substr(0, end + 4 + length);
          pending_.erase(0, end + 4 + length);
          return response;
        }
      }
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return "";
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

  // True if the server closed the connection (recv returns 0 or reset) within the timeout.
  bool ClosedByServer() {
    char buf[256];
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string pending_;
};

struct Response {
  int status = 0;
  std::string headers;  // lower-cased header block
  std::string body;
};

Response Parse(const std::string& raw) {
  Response r;
  size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, end);
  for (char& c : r.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = raw.substr(end + 4);
  return r;
}

Response Request(uint16_t port, const std::string& method, const std::string& target) {
  Client client(port);
  EXPECT_TRUE(client.connected());
  client.Send(method + " " + target + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
  return Parse(client.ReadAll());
}

Response Get(uint16_t port, const std::string& target) { return Request(port, "GET", target); }

class AdminServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    auto& counter = prometheus::BuildCounter()
                        .Name("tandem_test_requests_total")
                        .Help("Requests handled, by outcome.")
                        .Register(*registry_);
    counter.Add({{"outcome", "ok"}}).Increment(3);
    counter.Add({{"outcome", "error"}}).Increment(1);
    prometheus::BuildGauge().Name("tandem_test_queue_length").Help("Queued requests.").Register(*registry_).Add({}).Set(7);
    auto& histogram = prometheus::BuildHistogram()
                          .Name("tandem_test_ttft_seconds")
                          .Help("Time to first token.")
                          .Register(*registry_)
                          .Add({}, prometheus::Histogram::BucketBoundaries{0.05, 0.1, 0.5, 1, 5});
    histogram.Observe(0.2);
    histogram.Observe(2);
  }

  AdminServer::Options FastOptions() {
    AdminServer::Options options;
    options.request_timeout = milliseconds(300);
    return options;
  }

  std::shared_ptr<prometheus::Registry> registry_;
};

TEST_F(AdminServerTest, StartsOnAnEphemeralPortAndServesBuiltIns) {
  AdminServer server(registry_);
  EXPECT_EQ(server.bound_address(), "");
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  ASSERT_NE(port, 0);
  EXPECT_EQ(server.bound_address(), "127.0.0.1:" + std::to_string(port));

  Response health = Get(port, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");

  EXPECT_EQ(Get(port, "/readyz").status, 503);
  server.SetReady(true);
  Response ready = Get(port, "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");
  server.SetReady(false);
  EXPECT_EQ(Get(port, "/readyz").status, 503);

  Response metrics = Get(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("content-type: text/plain; version=0.0.4"), std::string::npos)
      << metrics.headers;
  EXPECT_NE(metrics.body.find("# TYPE tandem_test_requests_total counter"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("tandem_test_requests_total{outcome=\"ok\"} 3"), std::string::npos) << metrics.body;

  EXPECT_EQ(Get(port, "/nope").status, 404);
  EXPECT_EQ(Get(port, "/healthz?verbose=1").status, 200);
}

TEST_F(AdminServerTest, MetricsPassPromtool) {
  const char* promtool = "/usr/bin/promtool";
  if (!fs::exists(promtool)) {
    FAIL() << promtool << " is missing: run scripts/install-deps.sh (it installs the "
           << "'prometheus' package, which provides promtool)";
  }
  AdminServer server(registry_);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  Response metrics = Get(server.bound_port(), "/metrics");
  ASSERT_EQ(metrics.status, 200);
  const fs::path file = fs::temp_directory_path() / ("tandem_metrics_" + std::to_string(getpid()) + ".txt");
  std::ofstream(file) << metrics.body;
  const std::string command = std::string(promtool) + " check metrics < " + file.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int status = pclose(pipe);
  fs::remove(file);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output << "\n" << metrics.body;
}

TEST_F(AdminServerTest, HandlersMethodsAndHead) {
  AdminServer server(registry_);
  server.AddHandler("/stats", [](const HttpRequest& request) {
    return HttpResponse::Json("{\"query\":\"" + request.query + "\",\"ua\":\"" + request.Header("user-agent") + "\"}");
  });
  server.AddHandler("/boom", [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("boom"); });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  // Added after Start() too.
  server.AddHandler("/late", [](const HttpRequest&) { return HttpResponse::Text(201, "late"); });

  {
    Client client(port);
    client.Send("GET /stats?a=1 HTTP/1.1\r\nHost: t\r\nUser-Agent: tester\r\nConnection: close\r\n\r\n");
    Response stats = Parse(client.ReadAll());
    EXPECT_EQ(stats.status, 200);
    EXPECT_NE(stats.headers.find("content-type: application/json"), std::string::npos);
    EXPECT_EQ(stats.body, "{\"query\":\"a=1\",\"ua\":\"tester\"}");
  }
  EXPECT_EQ(Get(port, "/late").status, 201);
  EXPECT_EQ(Get(port, "/boom").status, 500);

  Response post = Request(port, "POST", "/healthz");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.headers.find("allow: get, head"), std::string::npos) << post.headers;
  EXPECT_EQ(Request(port, "DELETE", "/metrics").status, 405);
  EXPECT_EQ(Request(port, "POST", "/nope").status, 404);

  Response head = Request(port, "HEAD", "/healthz");
  EXPECT_EQ(head.status, 200);
  EXPECT_NE(head.headers.find("content-length: 3"), std::string::npos) << head.headers;
  EXPECT_EQ(head.body, "");
}

TEST_F(AdminServerTest, KeepAlive) {
  AdminServer server(registry_);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  Client client(server.bound_port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
    Response r = Parse(client.ReadResponse());
    EXPECT_EQ(r.status, 200) << i;
    EXPECT_EQ(r.body, "ok\n");
  }
  // HEAD then GET on the same connection: the HEAD answer has no body.
  ASSERT_TRUE(client.Send("HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"));
  EXPECT_EQ(Parse(client.ReadResponse(/*head=*/true)).status, 200);
  EXPECT_EQ(Parse(client.ReadResponse()).body, "ok\n");
}

TEST_F(AdminServerTest, StaticFilesWithContentTypesAndNoTraversal) {
  const fs::path base = fs::temp_directory_path() / ("tandem_admin_static_" + std::to_string(getpid()));
  fs::remove_all(base);
  fs::create_directories(base / "www" / "sub");
  std::ofstream(base / "www" / "index.html") << "<html>dash</html>";
  std::ofstream(base / "www" / "app.js") << "console.log(1);";
  std::ofstream(base / "www" / "style.css") << "body{}";
  std::ofstream(base / "www" / "data.json") << "{}";
  std::ofstream(base / "www" / "icon.svg") << "<svg/>";
  std::ofstream(base / "www" / "sub" / "img.png", std::ios::binary) << std::string("\x89PNG\r\n\x1a\n\0\1", 10);
  std::ofstream(base / "secret.txt") << "secret";
  fs::create_symlink(base / "secret.txt", base / "www" / "link.txt");

  AdminServer server(registry_);
  EXPECT_EQ(server.AddStaticDirectory("/dashboard", (base / "missing").string()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(server.AddStaticDirectory("dashboard", (base / "www").string()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(server.AddStaticDirectory("/dashboard/", (base / "www").string()).ok());
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();

  struct Case {
    const char* target;
    const char* content_type;
    std::string body;
  };
  const Case files[] = {
      {"/dashboard/", "text/html; charset=utf-8", "<html>dash</html>"},
      {"/dashboard/index.html", "text/html; charset=utf-8", "<html>dash</html>"},
      {"/dashboard/app.js", "text/javascript; charset=utf-8", "console.log(1);"},
      {"/dashboard/style.css", "text/css; charset=utf-8", "body{}"},
      {"/dashboard/data.json", "application/json", "{}"},
      {"/dashboard/icon.svg", "image/svg+xml", "<svg/>"},
      {"/dashboard/sub/img.png", "image/png", std::string("\x89PNG\r\n\x1a\n\0\1", 10)},
      {"/dashboard/%61pp.js", "text/javascript; charset=utf-8", "console.log(1);"},
  };
  for (const Case& c : files) {
    Response r = Get(port, c.target);
    EXPECT_EQ(r.status, 200) << c.target;
    EXPECT_NE(r.headers.find(std::string("content-type: ") + c.content_type), std::string::npos)
        << c.target << "\n" << r.headers;
    EXPECT_EQ(r.body, c.body) << c.target;
  }
  Response redirect = Get(port, "/dashboard");
  EXPECT_EQ(redirect.status, 301);
  EXPECT_NE(redirect.headers.find("location: /dashboard/"), std::string::npos);

  for (const char* target :
       {"/dashboard/../secret.txt", "/dashboard/sub/../../secret.txt", "/dashboard/%2e%2e/secret.txt",
        "/dashboard/..%2fsecret.txt", "/dashboard/%2E%2E%2Fsecret.txt", "/dashboard/sub/../app.js",
        "/dashboard/./app.js", "/dashboard/..\\secret.txt", "/dashboard/link.txt",
        "/dashboard/missing.js", "/dashboard/sub", "/dashboardx/app.js", "/secret.txt"}) {
    Response r = Get(port, target);
    EXPECT_EQ(r.status, 404) << target;
    EXPECT_EQ(r.body.find("secret"), std::string::npos) << target;
  }
  EXPECT_EQ(Get(port, "/dashboard/%zz").status, 400);
  EXPECT_EQ(Get(port, "/dashboard/a%00b").status, 400);
  fs::remove_all(base);
}

TEST_F(AdminServerTest, TwentyConcurrentClients) {
  AdminServer server(registry_);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 20; ++i) {
    clients.emplace_back([&, i] {
      Client client(port);
      for (int j = 0; j < 10; ++j) {
        const char* target = (i + j) % 2 == 0 ? "/healthz" : "/metrics";
        if (!client.Send(std::string("GET ") + target + " HTTP/1.1\r\nHost: t\r\n\r\n")) return;
        if (Parse(client.ReadResponse()).status == 200) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(AdminServerTest, SilentAndSlowClientsDoNotBlockOthers) {
  // A request timeout longer than any test: the stalled connections below are all still
  // open when the probe is answered, so it cannot have waited for them to be dropped.
  AdminServer::Options patient;
  patient.request_timeout = std::chrono::hours(1);
  AdminServer server(registry_, patient);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  // More stalled connections than server threads: one silent, some mid-request.
  Client silent(port);
  ASSERT_TRUE(silent.connected());
  std::vector<std::unique_ptr<Client>> partial;
  for (int i = 0; i < 4; ++i) {
    partial.push_back(std::make_unique<Client>(port));
    partial.back()->Send("GET /healthz HTTP/1.1\r\nHo");
  }
  EXPECT_EQ(Get(port, "/healthz").status, 200);
  EXPECT_EQ(Get(port, "/metrics").status, 200);
}

TEST_F(AdminServerTest, StalledConnectionsAreDroppedAfterTheRequestTimeout) {
  AdminServer server(registry_, FastOptions());  // 300 ms
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  Client silent(port);  // (its receive timeout, 5 s, only ends the wait if the server never closes)
  ASSERT_TRUE(silent.connected());
  std::vector<std::unique_ptr<Client>> partial;
  for (int i = 0; i < 4; ++i) {
    partial.push_back(std::make_unique<Client>(port));
    partial.back()->Send("GET /healthz HTTP/1.1\r\nHo");
  }
  EXPECT_TRUE(silent.ClosedByServer());
  for (auto& client : partial) EXPECT_TRUE(client->ClosedByServer());
  EXPECT_EQ(Get(port, "/healthz").status, 200);
}

TEST_F(AdminServerTest, OversizedAndMalformedRequests) {
  AdminServer server(registry_);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  const uint16_t port = server.bound_port();
  {
    Client client(port);
    client.Send("GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(70 * 1024, 'a') + "\r\n\r\n");
    EXPECT_EQ(Parse(client.ReadAll()).status, 413);
  }
  {
    Client client(port);
    client.Send("GET /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n");
    EXPECT_EQ(Parse(client.ReadAll()).status, 413);
  }
  {
    Client client(port);
    client.Send("NOT HTTP AT ALL\r\n\r\n");
    EXPECT_EQ(Parse(client.ReadAll()).status, 400);
  }
  // Still serving.
  EXPECT_EQ(Get(port, "/healthz").status, 200);
}

TEST_F(AdminServerTest, StartErrorsAndStop) {
  {
    AdminServer server;
    EXPECT_EQ(server.Start("nonsense").code(), absl::StatusCode::kInvalidArgument);
  }
  AdminServer first;
  ASSERT_TRUE(first.Start("127.0.0.1:0").ok());
  EXPECT_EQ(first.Start("127.0.0.1:0").code(), absl::StatusCode::kFailedPrecondition);
  {
    AdminServer second;
    absl::Status status = second.Start(first.bound_address());
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
  // An empty registry serves an empty exposition.
  Response metrics = Get(first.bound_port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.body, "");

  // Stop with a connection still open returns promptly and closes it.
  Client idle(first.bound_port());
  ASSERT_TRUE(idle.connected());
  idle.Send("GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
  EXPECT_EQ(Parse(idle.ReadResponse()).status, 200);
  first.Stop();  // returns (does not wait for the client to hang up) and closes it
  EXPECT_TRUE(idle.ClosedByServer());
  first.Stop();  // idempotent
  Client after(first.bound_port());
  EXPECT_FALSE(after.connected());
}

TEST_F(AdminServerTest, BindsLocalhostAndIpv6) {
  AdminServer server;
  ASSERT_TRUE(server.Start("localhost:0").ok());
  EXPECT_NE(server.bound_port(), 0);
  AdminServer v6;
  absl::Status status = v6.Start("[::1]:0");
  if (status.ok()) {
    EXPECT_EQ(v6.bound_address(), "[::1]:" + std::to_string(v6.bound_port()));
  } else {
    GTEST_LOG_(INFO) << "no IPv6 loopback here: " << status;
  }
}

}  // namespace
}  // namespace tandem::service
