// Prometheus metrics of the kvstore tier (docs/design.md §9), on both of its sides:
//  - the kvstore instance (role "kvstore"): counters and gauges read from the BlockStore's
//    stats when scraped (cache queries, hit tokens, bytes in and out, puts by outcome,
//    evictions and usage per tier, SSD reads/writes/corrupt files), and per-RPC latency and
//    outcome counts observed by the service's RPC decorator (KvStoreRpcMetrics);
//  - a prefill replica's client of the tier (role "prefill"): its counters read from
//    KvStoreClient::stats() when scraped (tandem_kvstore_client_*: queries, hit tokens,
//    bytes fetched and offloaded, errors).
// Nothing here runs on a request's path except KvStoreRpcMetrics::Observe (one histogram
// observation and one counter increment per RPC). Names: tandem_kvstore_<what>_<unit>;
// counters end in _total; labels model and role (and rpc/code, tier, outcome: bounded).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/kvstore/kv_store_stats.h"
#include "services/kvstore/kvstore_client.h"

namespace tandem::kvstore {

// Latency and outcome of the kvstore's RPCs, from an injected registry.
class KvStoreRpcMetrics {
 public:
  KvStoreRpcMetrics(prometheus::Registry& registry, const std::string& model);
  // `rpc`: Lookup, Reserve, Commit, Get or Stats; `code`: the gRPC status code's name.
  void Observe(const char* rpc, double seconds, const std::string& code);

 private:
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Counter>& calls_;
  std::string model_;
  std::vector<std::pair<std::string, prometheus::Histogram*>> histograms_;  // by RPC name
};

// The instance's stats as Prometheus families, read when scraped. `block_tokens` converts
// block counts to tokens.
std::shared_ptr<prometheus::Collectable> KvStoreStatsCollector(std::function<KvStoreStats()> stats,
                                                               const std::string& model, int32_t block_tokens);

// A prefill replica's client stats, read when scraped. `client` must outlive the collector.
std::shared_ptr<prometheus::Collectable> KvStoreClientCollector(const KvStoreClient* client, const std::string& model,
                                                                const std::string& role, int32_t block_tokens);

}  // namespace tandem::kvstore
