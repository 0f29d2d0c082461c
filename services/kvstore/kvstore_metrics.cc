#include "services/kvstore/kvstore_metrics.h"

#include <vector>

#include "prometheus/metric_family.h"

namespace tandem::kvstore {
namespace {

// Bounds for kvstore RPCs: lookups take tens of microseconds, gets of many blocks (or
// from the SSD tier) tens of milliseconds.
std::vector<double> RpcBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0};
}

// Builds metric families from plain values, one family per name (samples with the same
// name and different labels join it).
class Families {
 public:
  explicit Families(prometheus::ClientMetric::Label model, prometheus::ClientMetric::Label role)
      : model_(std::move(model)), role_(std::move(role)) {}

  void Add(const std::string& name, const std::string& help, prometheus::MetricType type, double value,
           std::vector<prometheus::ClientMetric::Label> extra = {}) {
    prometheus::ClientMetric m;
    m.label = {model_, role_};
    m.label.insert(m.label.end(), extra.begin(), extra.end());
    if (type == prometheus::MetricType::Counter) m.counter.value = value;
    else m.gauge.value = value;
    for (prometheus::MetricFamily& f : out_) {
      if (f.name == name) {
        f.metric.push_back(std::move(m));
        return;
      }
    }
    out_.push_back({name, help, type, {std::move(m)}});
  }
  std::vector<prometheus::MetricFamily> Take() { return std::move(out_); }

 private:
  prometheus::ClientMetric::Label model_, role_;
  std::vector<prometheus::MetricFamily> out_;
};

class StatsCollector : public prometheus::Collectable {
 public:
  StatsCollector(std::function<KvStoreStats()> stats, std::string model, int32_t block_tokens)
      : stats_(std::move(stats)), model_(std::move(model)), block_tokens_(block_tokens) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    const KvStoreStats s = stats_();
    const double tok = block_tokens_;
    Families f({"model", model_}, {"role", "kvstore"});
    f.Add("tandem_kvstore_lookups_total", "Lookup calls (cache queries)", MetricType::Counter, s.lookups);
    f.Add("tandem_kvstore_lookup_tokens_total", "Tokens (in full blocks) looked up", MetricType::Counter,
          s.lookup_blocks * tok);
    f.Add("tandem_kvstore_lookup_hit_tokens_total", "Tokens looked up and found (the leading cached run)",
          MetricType::Counter, s.lookup_hit_blocks * tok);
    f.Add("tandem_kvstore_hit_tokens_total", "Tokens served to readers (blocks written by gets)", MetricType::Counter,
          static_cast<double>(s.hit_tokens));
    f.Add("tandem_kvstore_get_misses_total", "Blocks asked for by gets but absent (evicted since the lookup)",
          MetricType::Counter, s.get_misses);
    f.Add("tandem_kvstore_bytes_total", "Block bytes moved: out to readers (get), in from writers (put, committed)",
          MetricType::Counter, s.get_bytes, {{"op", "get"}});
    f.Add("tandem_kvstore_bytes_total", "Block bytes moved: out to readers (get), in from writers (put, committed)",
          MetricType::Counter, s.put_bytes, {{"op", "put"}});
    const char* put_help = "Blocks offered by writers, by outcome";
    f.Add("tandem_kvstore_put_blocks_total", put_help, MetricType::Counter, s.committed_blocks,
          {{"outcome", "committed"}});
    f.Add("tandem_kvstore_put_blocks_total", put_help, MetricType::Counter, s.dedup_blocks,
          {{"outcome", "deduplicated"}});
    f.Add("tandem_kvstore_put_blocks_total", put_help, MetricType::Counter, s.no_room_blocks,
          {{"outcome", "no_room"}});
    f.Add("tandem_kvstore_put_blocks_total", put_help, MetricType::Counter, s.rejected_blocks,
          {{"outcome", "rejected"}});
    f.Add("tandem_kvstore_reservations_expired_total", "Writer reservations freed uncommitted after their lease",
          MetricType::Counter, s.expired_reservations);
    const char* ev_help = "Blocks evicted, by tier";
    f.Add("tandem_kvstore_evictions_total", ev_help, MetricType::Counter, s.dram_evictions, {{"tier", "dram"}});
    f.Add("tandem_kvstore_evictions_total", ev_help, MetricType::Counter, s.disk_evictions, {{"tier", "disk"}});
    f.Add("tandem_kvstore_blocks", "Blocks held, by tier", MetricType::Gauge, s.dram_blocks, {{"tier", "dram"}});
    f.Add("tandem_kvstore_blocks", "Blocks held, by tier", MetricType::Gauge, s.disk_blocks, {{"tier", "disk"}});
    f.Add("tandem_kvstore_used_bytes", "Bytes in use, by tier (DRAM: committed and reserved slots; disk: files)",
          MetricType::Gauge, s.dram_bytes_used, {{"tier", "dram"}});
    f.Add("tandem_kvstore_used_bytes", "Bytes in use, by tier (DRAM: committed and reserved slots; disk: files)",
          MetricType::Gauge, s.disk_bytes_used, {{"tier", "disk"}});
    f.Add("tandem_kvstore_capacity_bytes", "Capacity, by tier", MetricType::Gauge, s.dram_capacity_bytes,
          {{"tier", "dram"}});
    f.Add("tandem_kvstore_capacity_bytes", "Capacity, by tier", MetricType::Gauge, s.disk_capacity_bytes,
          {{"tier", "disk"}});
    f.Add("tandem_kvstore_disk_reads_total", "Blocks read from the SSD tier for gets (SSD hits)", MetricType::Counter,
          s.disk_reads);
    f.Add("tandem_kvstore_disk_writes_total", "Block files written to the SSD tier, by outcome", MetricType::Counter,
          s.disk_writes, {{"outcome", "ok"}});
    f.Add("tandem_kvstore_disk_writes_total", "Block files written to the SSD tier, by outcome", MetricType::Counter,
          s.disk_write_failures, {{"outcome", "failed"}});
    f.Add("tandem_kvstore_disk_corrupt_dropped_total", "Block files that did not verify (dropped, never served)",
          MetricType::Counter, s.disk_corrupt_dropped);
    f.Add("tandem_kvstore_disk_loaded_blocks", "Blocks found intact on the SSD tier at startup", MetricType::Gauge,
          s.disk_loaded_blocks);
    return f.Take();
  }

 private:
  std::function<KvStoreStats()> stats_;
  std::string model_;
  int32_t block_tokens_;
};

class ClientCollector : public prometheus::Collectable {
 public:
  ClientCollector(const KvStoreClient* client, std::string model, std::string role, int32_t block_tokens)
      : client_(client), model_(std::move(model)), role_(std::move(role)), block_tokens_(block_tokens) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    const KvStoreClientStats s = client_->stats();
    const double tok = block_tokens_;
    Families f({"model", model_}, {"role", role_});
    f.Add("tandem_kvstore_client_instances", "kvstore instances this replica shards over", MetricType::Gauge,
          static_cast<double>(client_->instances().size()));
    f.Add("tandem_kvstore_client_queries_total", "Prompts looked up in the kvstore tier (cache queries)",
          MetricType::Counter, s.fetches);
    f.Add("tandem_kvstore_client_queried_tokens_total", "Prompt tokens (in full blocks) looked up in the tier",
          MetricType::Counter, s.lookup_blocks * tok);
    f.Add("tandem_kvstore_client_stored_tokens_total", "Of those, the leading run the tier held",
          MetricType::Counter, s.lookup_hit_blocks * tok);
    f.Add("tandem_kvstore_client_hit_tokens_total",
          "Prompt tokens whose KV was fetched from the tier and verified (not recomputed)", MetricType::Counter,
          s.fetched_blocks * tok);
    f.Add("tandem_kvstore_client_bytes_total", "Block bytes moved: fetched from the tier, offloaded to it",
          MetricType::Counter, s.fetched_bytes, {{"op", "fetch"}});
    f.Add("tandem_kvstore_client_bytes_total", "Block bytes moved: fetched from the tier, offloaded to it",
          MetricType::Counter, s.offload_bytes, {{"op", "offload"}});
    f.Add("tandem_kvstore_client_errors_total",
          "Failed or late tier operations (the request computes instead), by operation", MetricType::Counter,
          s.fetch_errors, {{"op", "fetch"}});
    f.Add("tandem_kvstore_client_errors_total",
          "Failed or late tier operations (the request computes instead), by operation", MetricType::Counter,
          s.offload_errors, {{"op", "offload"}});
    f.Add("tandem_kvstore_client_checksum_mismatches_total", "Fetched blocks whose bytes did not verify (dropped)",
          MetricType::Counter, s.checksum_mismatches);
    f.Add("tandem_kvstore_client_staging_exhausted_total", "Fetches cut short by a full staging region",
          MetricType::Counter, s.staging_exhausted);
    f.Add("tandem_kvstore_client_offloads_total", "Offloads of new blocks, by outcome", MetricType::Counter,
          s.offloads, {{"outcome", "sent"}});
    f.Add("tandem_kvstore_client_offloads_total", "Offloads of new blocks, by outcome", MetricType::Counter,
          s.offload_dropped, {{"outcome", "dropped"}});
    f.Add("tandem_kvstore_client_offload_blocks_total",
          "Offloaded blocks: written and committed, or skipped (stored already, in flight elsewhere, no room)",
          MetricType::Counter, s.offload_blocks, {{"outcome", "written"}});
    f.Add("tandem_kvstore_client_offload_blocks_total",
          "Offloaded blocks: written and committed, or skipped (stored already, in flight elsewhere, no room)",
          MetricType::Counter, s.offload_dedup_blocks, {{"outcome", "skipped"}});
    return f.Take();
  }

 private:
  const KvStoreClient* client_;
  std::string model_, role_;
  int32_t block_tokens_;
};

}  // namespace

KvStoreRpcMetrics::KvStoreRpcMetrics(prometheus::Registry& registry, const std::string& model)
    : duration_(prometheus::BuildHistogram()
                    .Name("tandem_kvstore_rpc_duration_seconds")
                    .Help("kvstore RPCs from arrival to the answer (gets: once the blocks are written), by RPC")
                    .Labels({{"model", model}, {"role", "kvstore"}})
                    .Register(registry)),
      calls_(prometheus::BuildCounter()
                 .Name("tandem_kvstore_rpcs_total")
                 .Help("kvstore RPCs answered, by RPC and status code")
                 .Labels({{"model", model}, {"role", "kvstore"}})
                 .Register(registry)),
      model_(model) {
  for (const char* rpc : {"Lookup", "Reserve", "Commit", "Get", "Stats"}) {
    histograms_.emplace_back(rpc, &duration_.Add({{"rpc", rpc}}, RpcBuckets()));
    calls_.Add({{"rpc", rpc}, {"code", "OK"}});
  }
}

void KvStoreRpcMetrics::Observe(const char* rpc, double seconds, const std::string& code) {
  for (const auto& [name, h] : histograms_) {
    if (name == rpc) h->Observe(seconds);
  }
  calls_.Add({{"rpc", rpc}, {"code", code}}).Increment();
}

std::shared_ptr<prometheus::Collectable> KvStoreStatsCollector(std::function<KvStoreStats()> stats,
                                                               const std::string& model, int32_t block_tokens) {
  return std::make_shared<StatsCollector>(std::move(stats), model, block_tokens);
}

std::shared_ptr<prometheus::Collectable> KvStoreClientCollector(const KvStoreClient* client, const std::string& model,
                                                                const std::string& role, int32_t block_tokens) {
  return std::make_shared<ClientCollector>(client, model, role, block_tokens);
}

}  // namespace tandem::kvstore
