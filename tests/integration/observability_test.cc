// Observability end to end (docs/design.md §9): a real cluster under `tandem bench` load,
// scraped by a real Prometheus with deploy/prometheus/ (targets from the ready file by
// targets_from_ready_file.py, the recording rules), whose answers must agree with what the
// benchmark measured; every Grafana panel's query must return data; every service's
// /metrics must pass `promtool check metrics`; the router's /dashboard page, loaded in
// headless Chromium during the load, must draw its charts (a screenshot is kept under the
// build directory). Every service's /metrics (router, prefill, decode, both, kvstore), each
// under traffic, passes promtool and names its families. And one request followed through
// the router's, prefill's, decode's and kvstore's JSON logs by its id, which the client gets
// in the response's metadata (x-request-id).
//
// Needs prometheus, promtool and chromium (Debian packages; scripts/install-deps.sh).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/host_port.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

extern char** environ;

namespace tandem {
namespace {

namespace fs = std::filesystem;
using testing::BinaryPath;
using testing::RunProcess;

const char* kInstallHint = "; run scripts/install-deps.sh (it installs prometheus and chromium)";

std::string SourceDir() {
  const char* s = std::getenv("TANDEM_SOURCE_DIR");
  return s != nullptr ? s : ".";
}
std::string BuildDir() {
  const char* s = std::getenv("TANDEM_BINARY_DIR");
  return s != nullptr ? s : ".";
}

std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    const fs::path p = fs::path(dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

std::string MakeTempDir(const std::string& stem) {
  std::string tmpl = (fs::temp_directory_path() / (stem + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data());
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// GET over HTTP/1.0 (so that no server answers chunked); the body, or "" on failure.
std::string Http10Get(const std::string& host_port, const std::string& target, int* status = nullptr) {
  absl::StatusOr<service::HostPort> hp = service::ParseHostPort(host_port);
  if (!hp.ok()) return "";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(hp->port);
  ::inet_pton(AF_INET, hp->host == "localhost" ? "127.0.0.1" : hp->host.c_str(), &addr.sin_addr);
  timeval tv{.tv_sec = 30, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + target + " HTTP/1.0\r\nHost: " + host_port + "\r\n\r\n";
  ::send(fd, req.data(), req.size(), 0);
  std::string resp;
  char buf[16384];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (status != nullptr) *status = resp.size() > 12 ? std::atoi(resp.c_str() + 9) : 0;
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

std::string UrlEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// A background process (stdout and stderr to `log`), stopped when destroyed.
class Background {
 public:
  Background(const std::vector<std::string>& argv, const std::string& log) : log_(log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = 0;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Background() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  std::string log() const { return ReadFile(log_); }

 private:
  pid_t pid_ = 0;
  std::string log_;
};

// Prometheus' HTTP API.
class PromClient {
 public:
  explicit PromClient(std::string address) : address_(std::move(address)) {}
  // An instant query at `time`: the result vector ([] on error, with the reason logged).
  nlohmann::json Query(const std::string& promql, double time) const {
    char t[64];
    std::snprintf(t, sizeof t, "%.3f", time);
    const std::string body = Http10Get(address_, "/api/v1/query?query=" + UrlEncode(promql) + "&time=" + t);
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("status", "") != "success") {
      ADD_FAILURE() << "Prometheus query failed: " << promql << "\n" << body;
      return nlohmann::json::array();
    }
    return j["data"]["result"];
  }
  // The query's single value (NaN if there is none, or none finite).
  double Scalar(const std::string& promql, double time) const {
    const nlohmann::json r = Query(promql, time);
    for (const nlohmann::json& s : r) {
      const double v = std::strtod(s["value"][1].get<std::string>().c_str(), nullptr);
      if (std::isfinite(v)) return v;
    }
    return std::nan("");
  }
  std::string address() const { return address_; }

 private:
  std::string address_;
};

bool HasFiniteValue(const nlohmann::json& result) {
  for (const nlohmann::json& s : result) {
    if (std::isfinite(std::strtod(s["value"][1].get<std::string>().c_str(), nullptr))) return true;
  }
  return false;
}

// Every PromQL expression of the Grafana dashboard's panels (rows included).
std::vector<std::pair<std::string, std::string>> DashboardQueries(const nlohmann::json& dashboard) {
  std::vector<std::pair<std::string, std::string>> out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& panels) {
    for (const nlohmann::json& p : panels) {
      if (p.contains("panels")) walk(p["panels"]);
      if (!p.contains("targets")) continue;
      for (const nlohmann::json& t : p["targets"]) out.emplace_back(p.value("title", "?"), t.value("expr", ""));
    }
  };
  walk(dashboard["panels"]);
  return out;
}

std::vector<std::string> ChromiumArgs(const std::string& chromium, const std::string& profile) {
  // BUILD-NOTES.md: headless, as root, no network of its own.
  return {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
          "--user-data-dir=" + profile, "--window-size=1400,1700"};
}

// ---------------------------------------------------------------------------------------

TEST(ObservabilityConfigTest, PromtoolAcceptsTheConfigAndTheRules) {
  const std::string promtool = FindTool("promtool");
  ASSERT_FALSE(promtool.empty()) << "promtool not found" << kInstallHint;
  const fs::path deploy = fs::path(SourceDir()) / "deploy" / "prometheus";
  // The config as shipped, next to a targets file like the script writes.
  const fs::path dir = MakeTempDir("tandem-promtool");
  fs::copy_file(deploy / "prometheus.yml", dir / "prometheus.yml");
  fs::copy_file(deploy / "rules.yml", dir / "rules.yml");
  fs::create_directories(dir / "targets");
  WriteFile(dir / "targets" / "local.json",
            R"([{"targets": ["127.0.0.1:9"], "labels": {"role": "router", "process": "router"}}])");
  testing::ProcessResult config = RunProcess({promtool, "check", "config", (dir / "prometheus.yml").string()});
  EXPECT_EQ(config.exit_code, 0) << config.out << config.err;
  testing::ProcessResult rules = RunProcess({promtool, "check", "rules", (deploy / "rules.yml").string()});
  EXPECT_EQ(rules.exit_code, 0) << rules.out << rules.err;
  fs::remove_all(dir);
}

TEST(ObservabilityConfigTest, TargetsScriptTurnsReadyFilesIntoFileSdGroups) {
  const fs::path dir = MakeTempDir("tandem-targets");
  WriteFile(dir / "cluster.json", R"({"router": {}, "processes": [
      {"name": "router", "role": "router", "admin": "127.0.0.1:1001"},
      {"name": "prefill-0", "role": "prefill", "admin": "127.0.0.1:1002"},
      {"name": "decode-0", "role": "decode", "admin": "127.0.0.1:1003"}]})");
  WriteFile(dir / "one.json", R"({"role": "decode", "admin": "127.0.0.1:1004", "grpc": "127.0.0.1:5"})");
  WriteFile(dir / "bad.json", R"({"processes": [{"name": "x"}]})");
  const std::string script = SourceDir() + "/deploy/prometheus/targets_from_ready_file.py";
  testing::ProcessResult r = RunProcess({"/usr/bin/python3", script, (dir / "cluster.json").string(),
                                         (dir / "one.json").string(), "--cluster", "dev", "-o",
                                         (dir / "targets" / "t.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json groups = nlohmann::json::parse(ReadFile(dir / "targets" / "t.json"));
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[1]["targets"], nlohmann::json({"127.0.0.1:1002"}));
  EXPECT_EQ(groups[1]["labels"], nlohmann::json({{"role", "prefill"}, {"process", "prefill-0"}, {"cluster", "dev"}}));
  EXPECT_EQ(groups[3]["labels"]["role"], "decode");
  testing::ProcessResult bad = RunProcess({"/usr/bin/python3", script, (dir / "bad.json").string()});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("no admin address"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

TEST(ObservabilityConfigTest, GrafanaDashboardIsImportableAndEveryPanelHasQueries) {
  const std::string text = ReadFile(fs::path(SourceDir()) / "deploy" / "grafana" / "tandem-dashboard.json");
  const nlohmann::json d = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(d.is_discarded()) << "deploy/grafana/tandem-dashboard.json is not valid JSON";
  EXPECT_GE(d["schemaVersion"].get<int>(), 36);
  ASSERT_TRUE(d.contains("__inputs"));
  EXPECT_EQ(d["__inputs"][0]["name"], "DS_PROMETHEUS");
  EXPECT_EQ(d["__inputs"][0]["pluginId"], "prometheus");
  std::set<int> ids;
  std::set<std::string> titles;
  for (const nlohmann::json& p : d["panels"]) {
    ASSERT_TRUE(p.contains("id") && p.contains("gridPos") && p.contains("type")) << p.dump();
    EXPECT_TRUE(ids.insert(p["id"].get<int>()).second) << "duplicate panel id " << p["id"];
    if (p["type"] == "row") continue;
    titles.insert(p["title"].get<std::string>());
    EXPECT_EQ(p["datasource"]["uid"], "${DS_PROMETHEUS}") << p["title"];
    ASSERT_TRUE(p.contains("targets") && !p["targets"].empty()) << p["title"] << " has no targets";
    for (const nlohmann::json& t : p["targets"]) {
      EXPECT_FALSE(t.value("expr", "").empty()) << p["title"];
      EXPECT_EQ(t["datasource"]["uid"], "${DS_PROMETHEUS}") << p["title"];
    }
  }
  for (const char* title : {"Time to first token", "Inter-token latency", "Tokens/s in and out",
                            "Requests/s by outcome", "Queue: waiting and running per replica",
                            "KV cache usage per replica", "Prefix cache hit rate", "KV transfer bandwidth"}) {
    EXPECT_TRUE(titles.count(title)) << "no panel '" << title << "'";
  }
}

// The whole chain under load. Prometheus scrapes every second; the bench sends a
// shared-prefix workload at a bounded rate for ~25 s.
TEST(ObservabilityTest, PrometheusGrafanaAndDashboardAgreeWithTheBenchmark) {
  const std::string prometheus = FindTool("prometheus"), promtool = FindTool("promtool");
  std::string chromium = FindTool("chromium");
  if (chromium.empty()) chromium = FindTool("chromium-browser");
  ASSERT_FALSE(prometheus.empty()) << "prometheus not found" << kInstallHint;
  ASSERT_FALSE(promtool.empty()) << "promtool not found" << kInstallHint;
  ASSERT_FALSE(chromium.empty()) << "chromium not found" << kInstallHint;
  ASSERT_TRUE(fs::exists(fs::path(BuildDir()) / "share/tandem/dashboard/uPlot.iife.min.js"))
      << "the dashboard's uPlot is not in the build tree" << kInstallHint << ", then rebuild";

  const fs::path tmp = MakeTempDir("tandem-observability");
  const fs::path artifacts = fs::path(BuildDir()) / "observability";
  fs::create_directories(artifacts);

  // 1. The cluster: router, two prefill replicas (cache-aware routing keeps each prefix on
  // one of them), one decode replica, one kvstore (the prefill replicas' prefix tier).
  LocalClusterOptions options;
  options.num_prefill = 2;
  options.num_decode = 1;
  options.num_kvstore = 1;
  options.kvstore_args = {"--capacity=256M"};
  options.worker_args = {"--threads=1"};
  options.router_args = {"--heartbeat-ms=200"};
  auto cluster = testing::StartCluster(std::move(options));
  ASSERT_NE(cluster, nullptr);
  const nlohmann::json ready = cluster->ReadyJson();
  WriteFile(tmp / "ready.json", ready.dump(2));
  std::string router_admin;
  for (const nlohmann::json& p : ready["processes"]) {
    if (p["role"] == "router") router_admin = p["admin"];
  }
  ASSERT_FALSE(router_admin.empty());

  // 2. Prometheus with the shipped config and rules; targets from the ready file.
  const fs::path prom_dir = tmp / "prometheus";
  fs::create_directories(prom_dir / "targets");
  fs::copy_file(fs::path(SourceDir()) / "deploy/prometheus/prometheus.yml", prom_dir / "prometheus.yml");
  fs::copy_file(fs::path(SourceDir()) / "deploy/prometheus/rules.yml", prom_dir / "rules.yml");
  testing::ProcessResult targets =
      RunProcess({"/usr/bin/python3", SourceDir() + "/deploy/prometheus/targets_from_ready_file.py",
                  (tmp / "ready.json").string(), "-o", (prom_dir / "targets" / "local.json").string()});
  ASSERT_EQ(targets.exit_code, 0) << targets.err;
  const size_t num_targets = ready["processes"].size();
  const std::string prom_address = "127.0.0.1:" + std::to_string(FreePort());
  Background prom({prometheus, "--config.file=" + (prom_dir / "prometheus.yml").string(),
                   "--web.listen-address=" + prom_address, "--storage.tsdb.path=" + (prom_dir / "data").string(),
                   "--log.level=warn"},
                  (prom_dir / "prometheus.log").string());
  PromClient prom_api(prom_address);
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    size_t up = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      const nlohmann::json t = nlohmann::json::parse(Http10Get(prom_address, "/api/v1/targets?state=active"), nullptr,
                                                     /*allow_exceptions=*/false);
      up = 0;
      if (!t.is_discarded() && t.contains("data")) {
        for (const nlohmann::json& a : t["data"]["activeTargets"]) up += a["health"] == "up";
      }
      if (up == num_targets) break;
      ASSERT_TRUE(prom.running()) << "prometheus exited:\n" << prom.log();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    ASSERT_EQ(up, num_targets) << "Prometheus does not scrape every process:\n" << prom.log();
  }

  // 3. Load: shared prefixes (2 x 256 tokens) + 32 random tokens, 16 tokens out, 4
  // requests/s for ~25 s. A first run of two requests (same seed: the same prefixes) puts
  // the prefixes in the prefill replicas' caches, so that the measured TTFTs are one
  // population rather than two slow misses in a crowd of hits; a scrape separates it from
  // the measured window.
  auto bench_args = [&](int prompts, const std::string& rate, const std::string& json) {
    std::vector<std::string> a = {BinaryPath("tandem"), "bench", "--addr", cluster->router_address(),
                                  "--num-prompts", std::to_string(prompts), "--request-rate", rate, "--input-len",
                                  "32", "--output-len", "16", "--prefix-len", "256", "--num-prefixes", "2",
                                  "--ignore-eos", "--num-warmup", "0", "--seed", "7", "--no-progress"};
    if (!json.empty()) a.insert(a.end(), {"--json", json});
    return a;
  };
  testing::ProcessResult warmup = RunProcess(bench_args(2, "inf", ""), {}, 120);
  ASSERT_EQ(warmup.exit_code, 0) << warmup.out << warmup.err;
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  const double bench_start = UnixNow();
  testing::ProcessResult bench;
  std::thread bench_thread(
      [&] { bench = RunProcess(bench_args(100, "4", (tmp / "bench.json").string()), {}, 240); });

  // 4. The router's dashboard in headless Chromium while the load runs: the page marks
  // <body data-ready="true"> once every chart has points.
  std::this_thread::sleep_for(std::chrono::seconds(12));
  const std::string url = "http://" + router_admin + "/dashboard/?interval_ms=500&step=5";
  std::vector<std::string> dump = ChromiumArgs(chromium, (tmp / "chrome-dom").string());
  dump.insert(dump.end(), {"--virtual-time-budget=6000", "--dump-dom", url});
  testing::ProcessResult dom = RunProcess(dump, {}, 120);
  std::vector<std::string> shot = ChromiumArgs(chromium, (tmp / "chrome-shot").string());
  shot.insert(shot.end(), {"--virtual-time-budget=6000", "--screenshot=" + (artifacts / "dashboard.png").string(), url});
  testing::ProcessResult screenshot = RunProcess(shot, {}, 120);
  WriteFile(artifacts / "dashboard.html", dom.out);

  bench_thread.join();
  ASSERT_EQ(bench.exit_code, 0) << bench.out << bench.err;
  const nlohmann::json b = nlohmann::json::parse(ReadFile(tmp / "bench.json"))["result"];
  ASSERT_EQ(b["failed"].get<int>(), 0);

  EXPECT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_NE(dom.out.find("data-ready=\"true\""), std::string::npos)
      << "the dashboard's charts got no data; DOM saved in " << (artifacts / "dashboard.html") << "\n" << dom.err;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(dom.out, m, std::regex("data-replicas=\"4\""))) << "replica table";
  EXPECT_EQ(screenshot.exit_code, 0) << screenshot.err;
  EXPECT_TRUE(fs::exists(artifacts / "dashboard.png") && fs::file_size(artifacts / "dashboard.png") > 10000)
      << "no screenshot";

  // 5. Prometheus vs the benchmark over the run: each series' change from just before the
  // run (after the warm-up's last scrape) to after it, `x - x offset D`, so that no
  // extrapolation at the window's edges (increase() does that, per series) skews the
  // histogram; histogram_quantile then sees exactly the run's TTFTs. The router's TTFT
  // buckets are at most 20 % apart where they fall (ClientTtftBuckets), which bounds the
  // interpolation error.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // final scrapes + a rule evaluation
  const double at = UnixNow();
  const std::string offset = std::to_string(static_cast<int64_t>((at - (bench_start - 0.5)) * 1000)) + "ms";
  auto delta = [&](const std::string& selector, const std::string& by = "") {
    const std::string sum = by.empty() ? "sum(" : "sum by (" + by + ") (";
    return "(" + sum + selector + ") - " + sum + selector + " offset " + offset + "))";
  };
  // Rates for the rules and panels below: a window covering the run (not the warm-up).
  const std::string w = std::to_string(static_cast<int>(std::floor(at - bench_start))) + "s";
  const double duration = b["duration_s"].get<double>();
  const double bench_ttft_p99 = b["ttft_ms"]["p99"].get<double>() / 1e3;
  const double bench_tps = b["output_throughput"].get<double>();
  const double bench_hit = b["cached_input_tokens"].get<double>() / b["total_input_tokens"].get<double>();
  const double prom_ttft_p99 = prom_api.Scalar(
      "histogram_quantile(0.99, " + delta("tandem_time_to_first_token_seconds_bucket{role=\"router\"}", "le") + ")", at);
  const double prom_tps = prom_api.Scalar(delta("tandem_generation_tokens_total{role=\"router\"}"), at) / duration;
  const double prom_requests = prom_api.Scalar(delta("tandem_requests_total{role=\"router\",outcome=\"ok\"}"), at);
  const double prom_hit = prom_api.Scalar(delta("tandem_prefix_cache_hit_tokens_total{role=\"router\"}") + " / " +
                                              delta("tandem_prompt_tokens_total{role=\"router\"}"),
                                          at);
  const double replica_hit = prom_api.Scalar(delta("tandem_prefix_cache_hit_tokens_total{role=\"prefill\"}") + " / " +
                                                 delta("tandem_prefix_cache_queried_tokens_total{role=\"prefill\"}"),
                                             at);
  std::printf("bench: %d requests in %.1f s, TTFT p99 %.1f ms, %.1f generated tokens/s, cache hit %.3f\n",
              b["completed"].get<int>(), duration, bench_ttft_p99 * 1e3, bench_tps, bench_hit);
  std::printf("prometheus (offset %s): %.1f requests, TTFT p99 %.1f ms, %.1f generated tokens/s, cache hit %.3f "
              "(router) %.3f (prefill replicas)\n",
              offset.c_str(), prom_requests, prom_ttft_p99 * 1e3, prom_tps, prom_hit, replica_hit);
  EXPECT_EQ(prom_requests, b["completed"].get<double>());
  EXPECT_NEAR(prom_ttft_p99, bench_ttft_p99, 0.2 * bench_ttft_p99);
  EXPECT_NEAR(prom_tps, bench_tps, 0.2 * bench_tps);
  EXPECT_GT(bench_hit, 0.5);  // 256 of ~288 prompt tokens are shared
  EXPECT_NEAR(prom_hit, bench_hit, 0.2 * bench_hit);
  EXPECT_GT(replica_hit, 0.5);

  // The router's own /api/summary (the dashboard's numbers) over the same run: from its
  // last sample before the run started (after the warm-up).
  char since[32];
  std::snprintf(since, sizeof since, "%.3f", bench_start - 0.2);
  const nlohmann::json summary = nlohmann::json::parse(Http10Get(router_admin, std::string("/api/summary?since=") + since));
  const nlohmann::json& s = summary["summary"];
  ASSERT_TRUE(s.is_object()) << summary.dump();
  std::printf("router /api/summary (%.1f s): %.0f requests, TTFT p99 %.1f ms, %.1f generated tokens/s, cache hit %.3f\n",
              s["span_s"].get<double>(), s["requests"].get<double>(), s["ttft_p99_s"].get<double>() * 1e3,
              s["generation_tokens_per_s"].get<double>() * s["span_s"].get<double>() / duration,
              s["cache_hit_ratio"].get<double>());
  EXPECT_EQ(s["requests"].get<double>(), b["completed"].get<double>()) << summary.dump();
  EXPECT_NEAR(s["generation_tokens_per_s"].get<double>() * s["span_s"].get<double>() / duration, bench_tps,
              0.2 * bench_tps)
      << summary.dump();
  EXPECT_NEAR(s["ttft_p99_s"].get<double>(), bench_ttft_p99, 0.2 * bench_ttft_p99) << summary.dump();
  EXPECT_NEAR(s["cache_hit_ratio"].get<double>(), bench_hit, 0.2 * bench_hit) << summary.dump();

  // 6. Every recording rule and every Grafana panel query returns data. Grafana's
  // $__rate_interval becomes the run's window.
  const std::string rules = ReadFile(fs::path(SourceDir()) / "deploy/prometheus/rules.yml");
  const std::regex record_re("record:\\s*(\\S+)");
  int num_rules = 0;
  for (auto it = std::sregex_iterator(rules.begin(), rules.end(), record_re); it != std::sregex_iterator(); ++it) {
    ++num_rules;
    const std::string name = (*it)[1];
    EXPECT_TRUE(HasFiniteValue(prom_api.Query(name, at))) << "recording rule " << name << " has no value";
  }
  EXPECT_GE(num_rules, 10);
  const nlohmann::json dashboard =
      nlohmann::json::parse(ReadFile(fs::path(SourceDir()) / "deploy/grafana/tandem-dashboard.json"));
  int num_queries = 0;
  for (auto [title, expr] : DashboardQueries(dashboard)) {
    ++num_queries;
    for (const char* var : {"$__rate_interval", "$__interval", "$__range"}) {
      for (size_t pos; (pos = expr.find(var)) != std::string::npos;) expr.replace(pos, std::strlen(var), w);
    }
    EXPECT_TRUE(HasFiniteValue(prom_api.Query(expr, at))) << "panel '" << title << "': no data for " << expr;
  }
  EXPECT_GE(num_queries, 10);

  // 7. Every service's exposition passes promtool's checks.
  for (const nlohmann::json& p : ready["processes"]) {
    const std::string text = Http10Get(p["admin"], "/metrics");
    ASSERT_FALSE(text.empty()) << p["name"];
    const fs::path file = tmp / (p["name"].get<std::string>() + ".metrics.txt");
    WriteFile(file, text);
    testing::ProcessResult check =
        RunProcess({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file.string()});
    EXPECT_EQ(check.exit_code, 0) << p["name"] << ": " << check.out << check.err;
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

// Every kind of service under traffic, its /metrics checked by promtool and for the
// families it must have: requests through the router (prefill and decode replicas, the
// kvstore tier serving hits: the prefill replica keeps no prefix cache of its own) and
// requests straight to an aggregated (--role both) worker.
TEST(ObservabilityTest, EveryServiceExpositionPassesPromtoolUnderTraffic) {
  const std::string promtool = FindTool("promtool");
  ASSERT_FALSE(promtool.empty()) << "promtool not found" << kInstallHint;
  LocalClusterOptions options;
  options.num_prefill = 1;
  options.num_decode = 1;
  options.num_both = 1;
  options.num_kvstore = 1;
  options.kvstore_args = {"--capacity=64M"};
  options.worker_args = {"--threads=1"};
  options.prefill_args = {"--no-prefix-cache"};
  options.router_args = {"--heartbeat-ms=200"};
  auto cluster = testing::StartCluster(std::move(options));
  ASSERT_NE(cluster, nullptr);
  const nlohmann::json ready = cluster->ReadyJson();
  std::string both_grpc;
  for (const nlohmann::json& p : ready["processes"]) {
    if (p["role"] == "both") both_grpc = p["grpc"];
  }
  ASSERT_FALSE(both_grpc.empty());
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "The kvstore keeps prefix blocks; ";
  auto router = testing::GenerationStub(cluster->router_address());
  // The aggregated worker serves its Generation on an internal port: the cluster's credentials.
  auto both = v1::Generation::NewStub(testing::InternalChannel(*cluster, both_grpc));
  for (int i = 0; i < 4; ++i) {
    for (auto* stub : {router.get(), both.get()}) {
      testing::StreamResult r = testing::Generate(*stub, testing::TextRequest(prompt, 8, std::nullopt, 0.0f));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the offload lands
  }
  // Families each role must expose (besides promtool's checks of every line).
  const std::map<std::string, std::vector<std::string>> required = {
      {"router",
       {"tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds", "tandem_time_per_output_token_seconds",
        "tandem_e2e_request_latency_seconds", "tandem_request_queue_time_seconds", "tandem_requests_total",
        "tandem_prompt_tokens_total", "tandem_generation_tokens_total", "tandem_replicas"}},
      {"prefill",
       {"tandem_time_to_first_token_seconds", "tandem_request_prefill_time_seconds", "tandem_requests_waiting",
        "tandem_requests_running", "tandem_kv_cache_usage_ratio", "tandem_prefix_cache_queries_total",
        "tandem_kv_transfer_bytes_total", "tandem_kv_transfer_duration_seconds", "tandem_kvstore_client_queries_total",
        "tandem_kvstore_client_hit_tokens_total", "tandem_kvstore_client_bytes_total"}},
      {"decode", {"tandem_requests_running", "tandem_kv_cache_usage_ratio", "tandem_generation_tokens_total"}},
      {"both",
       {"tandem_time_to_first_token_seconds", "tandem_requests_total", "tandem_generation_tokens_total",
        "tandem_prefix_cache_hit_tokens_total"}},
      {"kvstore",
       {"tandem_kvstore_lookups_total", "tandem_kvstore_hit_tokens_total", "tandem_kvstore_bytes_total",
        "tandem_kvstore_evictions_total", "tandem_kvstore_used_bytes", "tandem_kvstore_rpc_duration_seconds",
        "tandem_kvstore_rpcs_total"}}};
  const fs::path tmp = MakeTempDir("tandem-promtool-services");
  std::set<std::string> roles;
  for (const nlohmann::json& p : ready["processes"]) {
    const std::string role = p["role"], name = p["name"];
    roles.insert(role);
    const std::string text = Http10Get(p["admin"], "/metrics");
    ASSERT_FALSE(text.empty()) << name;
    const fs::path file = tmp / (name + ".metrics.txt");
    WriteFile(file, text);
    testing::ProcessResult check =
        RunProcess({"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file.string()});
    EXPECT_EQ(check.exit_code, 0) << name << ": " << check.out << check.err;
    for (const std::string& family : required.at(role)) {
      EXPECT_NE(text.find("# TYPE " + family + " "), std::string::npos) << name << " has no " << family;
    }
  }
  EXPECT_EQ(roles, (std::set<std::string>{"router", "prefill", "decode", "both", "kvstore"}));
  // The kvstore served hits, and both sides count them.
  auto value = [](const std::string& text, const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::strtod(text.c_str() + at + series.size() + 2, nullptr);
  };
  for (const nlohmann::json& p : ready["processes"]) {
    const std::string text = ReadFile(tmp / (p["name"].get<std::string>() + ".metrics.txt"));
    if (p["role"] == "kvstore") {
      EXPECT_GT(value(text, "tandem_kvstore_hit_tokens_total{model=\"tiny\",role=\"kvstore\"}"), 0) << text;
    }
    if (p["role"] == "prefill") {
      EXPECT_GT(value(text, "tandem_kvstore_client_hit_tokens_total{model=\"tiny\",role=\"prefill\"}"), 0) << text;
    }
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

// One request followed through every process's JSON log by the id the router assigned,
// which the client also gets in the response's initial metadata (x-request-id). The prompt
// spans full KV blocks, so the prefill replica asks the kvstore tier (and offloads to it).
TEST(ObservabilityTest, OneRequestIdInTheRouterPrefillDecodeAndKvstoreLogs) {
  LocalClusterOptions options;
  options.num_prefill = 1;
  options.num_decode = 1;
  options.num_kvstore = 1;
  options.kvstore_args = {"--capacity=64M", "--log-format=json", "--log-level=debug"};
  options.worker_args = {"--log-format=json", "--log-level=debug", "--threads=1"};
  options.router_args = {"--log-format=json", "--log-level=debug", "--heartbeat-ms=200"};
  auto cluster = testing::StartCluster(std::move(options));
  ASSERT_NE(cluster, nullptr);
  auto stub = testing::GenerationStub(cluster->router_address());
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "Follow me through the logs. ";
  testing::StreamResult r = testing::Generate(*stub, testing::TextRequest(prompt, 8, 1, 0.0f));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_FALSE(r.request_id.empty());
  EXPECT_EQ(r.header_request_id, r.request_id) << "x-request-id in the response metadata";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the offload's RPCs
  const nlohmann::json ready = cluster->ReadyJson();
  cluster->Stop();  // every process has written its last line

  std::set<std::string> roles_with_id;
  for (const nlohmann::json& p : ready["processes"]) {
    std::istringstream log(ReadFile(p["log"].get<std::string>()));
    int lines = 0, json_lines = 0;
    for (std::string line; std::getline(log, line);) {
      if (line.empty() || line[0] != '{') continue;  // UCX may print its own lines
      ++lines;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;
      ++json_lines;
      if (j.value("request_id", "") == r.request_id) roles_with_id.insert(p["role"].get<std::string>());
    }
    EXPECT_GT(json_lines, 0) << p["name"] << " wrote no JSON log lines";
    EXPECT_EQ(json_lines, lines) << p["name"] << ": a line starting with '{' is not JSON";
  }
  EXPECT_EQ(roles_with_id, (std::set<std::string>{"router", "prefill", "decode", "kvstore"}))
      << "request " << r.request_id << " is not in every process's log";
}

}  // namespace
}  // namespace tandem
