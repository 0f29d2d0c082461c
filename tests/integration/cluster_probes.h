// What integration tests read from a running local cluster's processes (their /stats and
// /metrics), and a steady load of clients to keep one busy while a test disturbs it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/cluster_fixture.h"

namespace tandem::testing {

std::optional<ProcessInfo> ProcessNamed(const LocalCluster& cluster, const std::string& name);
// A number from process `name`'s /stats (-1 when it does not answer).
int64_t Stat(const LocalCluster& cluster, const std::string& name, const std::string& key);
// The value of one sample of the Prometheus text at `name`'s /metrics: the line of metric
// `metric` containing `label` ("" for any); -1 when absent.
double Metric(const LocalCluster& cluster, const std::string& name, const std::string& metric,
              const std::string& label = "");
// The same from the Prometheus text `text`.
double MetricIn(const std::string& text, const std::string& metric, const std::string& label = "");
// Quarantined leases' writers at `writer_address` the decode replica `name` has not yet
// seen stop (its /stats kv_quarantine_writers); -1 when it does not answer.
int64_t QuarantineWritersAt(const LocalCluster& cluster, const std::string& name, const std::string& writer_address);
// Every worker's KV blocks in use reach 0 within 15 s (a gtest failure per one that does not).
void ExpectAllKvFree(const LocalCluster& cluster);
// Waits (bounded: a stuck cluster fails the test, not hangs it) until `name` has a prompt
// in its engine.
bool WaitUntilBusy(const LocalCluster& cluster, const std::string& name);

// Kills `name` with SIGKILL once it has at least `busy` requests running (waiting at most
// 60 s), after a further random 0 to max_delay_ms from `rng`, and prints when (replay a
// failure with the seed the caller printed). False when the kill failed.
bool KillWhenBusy(LocalCluster& cluster, const std::string& name, int64_t busy, int max_delay_ms, std::mt19937& rng);
// Streams the router migrated after a decode replica failed (the "migrating after" lines of
// its log); *log, when given, is the log's path.
int RouterMigrations(const LocalCluster& cluster, std::string* log = nullptr);

// Clients sending requests from a fixed set, one at a time each, until stopped; each
// result is kept with its prompt and whether it started after Mark().
class SteadyLoad {
 public:
  struct Done {
    int prompt;
    bool after_mark;
    StreamResult result;
  };
  SteadyLoad(v1::Generation::Stub* stub, const std::vector<v1::GenerateRequest>* reqs, int clients,
             double timeout_s = 60);
  void Mark() { marked_ = true; }
  std::vector<Done> Stop();
  ~SteadyLoad();

 private:
  std::atomic<bool> stop_{false}, marked_{false};
  std::mutex mu_;
  std::vector<Done> done_;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::testing
