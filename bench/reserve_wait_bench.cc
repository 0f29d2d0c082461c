// Decode.Reserve traffic at saturation: more concurrent requests than the decode
// replica's KV pool holds (--concurrency, default 1100, over a pool of --kv-cache-mb), so
// about a thousand wait for room at any time. Measured in the same window of the same run:
// the Reserve calls per second the decode replica receives
// (tandem_decode_reserve_requests_total) and the rate at which requests are admitted
// (first tokens per second at the client: a request's first token follows its
// reservation). The goal: reserve_per_s / admitted_per_s <= 2 (the old router re-sent
// Reserve every 20 ms per waiting request: ~50 per waiting request per second).
//
// Closed loop: each client thread sends its next request when the previous one ends.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "services/launcher/local_cluster.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {
namespace {

// GET http://host:port/path; "" on failure.
std::string HttpGet(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) return "";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  std::string resp;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// A metric's value in a Prometheus text page, its first series (-1: absent).
double Metric(const std::string& page, const std::string& name) {
  size_t pos = 0;
  while ((pos = page.find(name, pos)) != std::string::npos) {
    const size_t after = pos + name.size();
    // "name value" or "name{labels} value" (the engine's metrics carry model and role).
    if ((pos == 0 || page[pos - 1] == '\n') && after < page.size() && (page[after] == ' ' || page[after] == '{')) {
      const std::string line = page.substr(pos, page.find('\n', pos) - pos);
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    pos = after;
  }
  return -1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App app("Decode.Reserve calls per admitted request with about a thousand requests waiting for KV room");
  int concurrency = 1100, prompt_tokens = 48, output_tokens = 4, threads = 1;
  int64_t kv_cache_mb = 8;
  double warmup_s = 20, window_s = 30;
  std::string json, run_dir = "/tmp/tandem-reserve-wait-bench", model = "tiny";
  app.add_option("--concurrency", concurrency, "Client streams, each sending its next request when one ends");
  app.add_option("--prompt-tokens", prompt_tokens, "Prompt length (token ids)");
  app.add_option("--output-tokens", output_tokens, "max_tokens of each request");
  app.add_option("--kv-cache-mb", kv_cache_mb, "The decode replica's KV pool");
  app.add_option("--threads", threads, "Model threads per worker");
  app.add_option("--warmup-s", warmup_s, "Seconds before the measured window (the queue fills)");
  app.add_option("--window-s", window_s, "The measured window");
  app.add_option("--model", model, "Model (a built-in name or a directory)");
  app.add_option("--run-dir", run_dir, "Logs and ready files");
  app.add_option("--json", json, "Also write the JSON here");
  CLI11_PARSE(app, argc, argv);

  LocalClusterOptions o;
  o.bin_dir = SelfBinaryDir();
  o.run_dir = run_dir;
  o.model = model;
  o.num_prefill = 1;
  o.num_decode = 1;
  // A small KV pool (the prefill replica's too: its requests end at the first token).
  o.worker_args = {"--threads=" + std::to_string(threads), "--kv-cache-mb=" + std::to_string(kv_cache_mb)};
  o.router_args = {"--max-prefill-queue=100000", "--max-decode-queue=100000", "--max-queue-wait-ms=600000"};
  o.log = [](const std::string& line) { std::fprintf(stderr, "[cluster] %s\n", line.c_str()); };
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cannot start the cluster: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  std::string decode_admin;
  for (const ProcessInfo& p : (*cluster)->processes()) {
    if (p.role == "decode") decode_admin = p.ready.value("admin", "");
  }
  auto channel = grpc::CreateChannel((*cluster)->router_address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> first_tokens{0}, completed{0}, failed{0};
  std::vector<std::thread> clients;
  clients.reserve(concurrency);
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&, c] {
      for (int n = 0; !stop; ++n) {
        v1::GenerateRequest req;
        for (int i = 0; i < prompt_tokens; ++i) req.mutable_token_ids()->add_ids(100 + (c * 31 + n * 7 + i * 13) % 900);
        req.mutable_stop()->set_max_tokens(output_tokens);
        req.mutable_stop()->set_ignore_eos(true);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(600));
        auto reader = stub->Generate(&ctx, req);
        v1::GenerateResponse m;
        bool first = true;
        while (reader->Read(&m)) {
          if (first && m.token_ids_size() > 0) {
            first_tokens++;
            first = false;
          }
        }
        if (reader->Finish().ok()) completed++;
        else failed++;
      }
    });
  }
  struct Sample {
    double reserves, waiting;
    int64_t first_tokens;
    std::chrono::steady_clock::time_point at;
  };
  auto sample = [&] {
    const std::string page = HttpGet(decode_admin, "/metrics");
    return Sample{Metric(page, "tandem_decode_reserve_requests_total"), Metric(page, "tandem_decode_reserve_waiting"),
                  first_tokens.load(), std::chrono::steady_clock::now()};
  };
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup_s));
  const Sample a = sample();
  double waiting_min = a.waiting, waiting_max = a.waiting;
  const auto end = a.at + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(window_s));
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const Sample s = sample();
    waiting_min = std::min(waiting_min, s.waiting);
    waiting_max = std::max(waiting_max, s.waiting);
  }
  const Sample b = sample();
  stop = true;
  (*cluster)->Stop();  // ends the streams still waiting
  for (auto& t : clients) t.join();

  const double seconds = std::chrono::duration<double>(b.at - a.at).count();
  const double reserve_per_s = (b.reserves - a.reserves) / seconds;
  const double admitted_per_s = static_cast<double>(b.first_tokens - a.first_tokens) / seconds;
  nlohmann::json out = {{"concurrency", concurrency},
                        {"kv_cache_mb", kv_cache_mb},
                        {"prompt_tokens", prompt_tokens},
                        {"output_tokens", output_tokens},
                        {"window_s", seconds},
                        {"waiting_in_replica_queue_min", waiting_min},
                        {"waiting_in_replica_queue_max", waiting_max},
                        {"reserve_calls_per_s", reserve_per_s},
                        {"admitted_per_s", admitted_per_s},
                        {"reserve_per_admitted", admitted_per_s > 0 ? reserve_per_s / admitted_per_s : -1},
                        {"goal_reserve_per_admitted_at_most", 2.0},
                        {"completed", completed.load()},
                        {"failed_after_stop", failed.load()}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
  return 0;
}
