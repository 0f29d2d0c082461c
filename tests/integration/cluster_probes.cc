#include "tests/integration/cluster_probes.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {
namespace {

nlohmann::json StatsOf(const ProcessInfo& p) {
  nlohmann::json j = nlohmann::json::parse(HttpGet(p.ready.value("admin", ""), "/stats"), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace

std::optional<ProcessInfo> ProcessNamed(const LocalCluster& cluster, const std::string& name) {
  for (ProcessInfo& p : cluster.processes()) {
    if (p.name == name) return std::move(p);
  }
  return std::nullopt;
}

int64_t Stat(const LocalCluster& cluster, const std::string& name, const std::string& key) {
  const std::optional<ProcessInfo> p = ProcessNamed(cluster, name);
  return p ? StatsOf(*p).value(key, int64_t{-1}) : -1;
}

double Metric(const LocalCluster& cluster, const std::string& name, const std::string& metric,
              const std::string& label) {
  const std::optional<ProcessInfo> p = ProcessNamed(cluster, name);
  return p ? MetricIn(HttpGet(p->ready.value("admin", ""), "/metrics"), metric, label) : -1;
}

double MetricIn(const std::string& text, const std::string& metric, const std::string& label) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric, 0) != 0 || (line.size() > metric.size() && line[metric.size()] != '{' &&
                                       line[metric.size()] != ' ')) {
      continue;
    }
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

int64_t QuarantineWritersAt(const LocalCluster& cluster, const std::string& name, const std::string& writer_address) {
  const std::optional<ProcessInfo> p = ProcessNamed(cluster, name);
  if (!p) return -1;
  const nlohmann::json j = StatsOf(*p);
  if (!j.contains("kv_quarantine_writers")) return -1;
  return j["kv_quarantine_writers"].value(writer_address, int64_t{0});
}

void ExpectAllKvFree(const LocalCluster& cluster) {
  for (const ProcessInfo& first : cluster.processes()) {
    if (first.role == "router" || first.role == "kvstore" || first.pid <= 0) continue;
    int64_t in_use = -1;
    for (int i = 0; i < 300 && in_use != 0; ++i) {
      // Looked up again each time: a replica restarted after a kill gets new addresses
      // once it is ready, which may be after this started.
      const std::optional<ProcessInfo> p = ProcessNamed(cluster, first.name);
      in_use = p ? StatsOf(*p).value("kv_blocks_in_use", int64_t{-1}) : -1;
      if (in_use != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(in_use, 0) << first.name;
  }
}

bool WaitUntilBusy(const LocalCluster& cluster, const std::string& name) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < limit) {
    if (Stat(cluster, name, "running") >= 1) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

bool KillWhenBusy(LocalCluster& cluster, const std::string& name, int64_t busy, int max_delay_ms, std::mt19937& rng) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < t0 + std::chrono::seconds(60) && Stat(cluster, name, "running") < busy) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int delay_ms = static_cast<int>(rng() % static_cast<uint32_t>(max_delay_ms + 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("kill -9 %s after %.2f s (%lld running + %d ms)\n", name.c_str(), waited, static_cast<long long>(busy),
              delay_ms);
  return cluster.Kill(name, SIGKILL).ok();
}

int RouterMigrations(const LocalCluster& cluster, std::string* log) {
  const std::string path = cluster.ReadyJson()["processes"][0].value("log", "");
  if (log != nullptr) *log = path;
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("migrating after") != std::string::npos;
  return n;
}

SteadyLoad::SteadyLoad(v1::Generation::Stub* stub, const std::vector<v1::GenerateRequest>* reqs, int clients,
                       double timeout_s) {
  for (int c = 0; c < clients; ++c) {
    threads_.emplace_back([this, stub, reqs, c, clients, timeout_s] {
      for (int i = c; !stop_; i += clients) {
        const int prompt = i % static_cast<int>(reqs->size());
        const bool after = marked_;
        StreamResult r = Generate(*stub, (*reqs)[prompt], timeout_s);
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back({prompt, after, std::move(r)});
      }
    });
  }
}

std::vector<SteadyLoad::Done> SteadyLoad::Stop() {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(done_);
}

SteadyLoad::~SteadyLoad() {
  if (!threads_.empty()) Stop();
}

}  // namespace tandem::testing
