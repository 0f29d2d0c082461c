#include "services/router/replica_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/grpc_keepalive.h"

namespace tandem {

ReplicaRegistry::ReplicaRegistry(Options options) : options_(std::move(options)) {
  if (!options_.clock) options_.clock = [] { return std::chrono::steady_clock::now(); };
}

absl::StatusOr<std::string> ReplicaRegistry::Register(const v1::RegisterRequest& r) {
  if (r.grpc_address().empty()) return absl::InvalidArgumentError("grpc_address: empty");
  if (r.role() == v1::ROLE_UNSPECIFIED) return absl::InvalidArgumentError("role: unspecified");
  if (options_.layout_fingerprint != 0 && r.layout_fingerprint() != options_.layout_fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "layout_fingerprint: %016x differs from the router's %016x (another model or build, or speculative "
        "decoding on one side only: --speculative-tokens); not admitted",
        r.layout_fingerprint(), options_.layout_fingerprint));
  }
  auto replica = std::make_shared<Replica>();
  replica->role = r.role();
  replica->grpc_address = r.grpc_address();
  replica->admin_address = r.admin_address();
  replica->pid = r.pid();
  replica->instance_name = r.instance_name();
  grpc::ChannelArguments args;
  // Keepalive pings find a silent peer even between heartbeats.
  service::SetClientKeepalive(args);
  replica->channel = security::OpenChannel(options_.channel_factory, r.grpc_address(), args);
  replica->prefill = v1::Prefill::NewStub(replica->channel);
  replica->decode = v1::Decode::NewStub(replica->channel);
  replica->generation = v1::Generation::NewStub(replica->channel);
  replica->load = r.load();
  replica->last_heartbeat = options_.clock();
  {
    std::unique_lock<std::shared_mutex> cache(replica->cache_mu);  // (not shared yet)
    ApplyKvEvents(r.kv_events(), &replica->cached_blocks);
    replica->cached_block_count = static_cast<int64_t>(replica->cached_blocks.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  // A replica restarting on the same address replaces its old entry.
  for (auto it = replicas_.begin(); it != replicas_.end();) {
    const bool same_kvstore = r.role() == v1::ROLE_KVSTORE && it->second->role == v1::ROLE_KVSTORE &&
                              !r.instance_name().empty() && it->second->instance_name == r.instance_name();
    if (it->second->grpc_address == r.grpc_address() || same_kvstore) it = replicas_.erase(it);
    else ++it;
  }
  const char* prefix = r.role() == v1::ROLE_PREFILL  ? "prefill"
                       : r.role() == v1::ROLE_DECODE ? "decode"
                       : r.role() == v1::ROLE_KVSTORE ? "kvstore"
                                                      : "both";
  replica->id = absl::StrCat(prefix, "-", next_id_++);
  replicas_[replica->id] = replica;
  return replica->id;
}

bool ReplicaRegistry::Heartbeat(const v1::HeartbeatRequest& r) {
  ReplicaPtr replica;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replicas_.find(r.replica_id());
    if (it == replicas_.end()) return false;
    replica = it->second;
    replica->load = r.load();
    replica->draining = r.draining();
    replica->last_heartbeat = options_.clock();
  }
  // The events outside the registry's mutex: a long list (a full resend) holds up only
  // picks that score this replica. A replica's heartbeats come one at a time (its
  // registration loop waits for each answer), so its events apply in order.
  if (r.kv_events().full() || r.kv_events().stored_size() > 0 || r.kv_events().removed_size() > 0) {
    std::unique_lock<std::shared_mutex> cache(replica->cache_mu);
    ApplyKvEvents(r.kv_events(), &replica->cached_blocks);
    replica->cached_block_count = static_cast<int64_t>(replica->cached_blocks.size());
  }
  return true;
}

void ReplicaRegistry::Deregister(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  replicas_.erase(id);
}

std::vector<std::string> ReplicaRegistry::DropSilent() {
  const auto now = options_.clock();
  const auto limit = options_.heartbeat_interval * options_.missed_heartbeats_to_drop;
  std::vector<std::string> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  if (last_drop_check_ && now - *last_drop_check_ > 2 * options_.heartbeat_interval) {
    no_drops_until_ = now + limit;
  }
  last_drop_check_ = now;
  if (now < no_drops_until_) return dropped;
  for (auto it = replicas_.begin(); it != replicas_.end();) {
    if (now - it->second->last_heartbeat > limit) {
      dropped.push_back(it->first);
      it->second->MarkLost();  // its calls in flight fail now, so requests move elsewhere
      it = replicas_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

std::vector<ReplicaPtr> ReplicaRegistry::Candidates(v1::Role role) const {
  std::vector<ReplicaPtr> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, r] : replicas_) {
    if (r->draining) continue;
    if (r->role == role) out.push_back(r);
  }
  return out;
}

ReplicaPtr ReplicaRegistry::PickRoundRobin(v1::Role role, const std::vector<std::string>& exclude) {
  std::vector<ReplicaPtr> c = Candidates(role);
  c.erase(std::remove_if(c.begin(), c.end(),
                         [&](const ReplicaPtr& r) {
                           return std::find(exclude.begin(), exclude.end(), r->id) != exclude.end();
                         }),
          c.end());
  if (c.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return c[rr_[role]++ % c.size()];
}

void ReplicaRegistry::List(v1::ListReplicasResponse* out) const {
  const auto now = options_.clock();
  std::lock_guard<std::mutex> lock(mu_);
  out->set_model(options_.model);
  for (const auto& [id, r] : replicas_) {
    v1::ReplicaInfo* info = out->add_replicas();
    info->set_replica_id(id);
    info->set_role(r->role);
    info->set_grpc_address(r->grpc_address);
    info->set_admin_address(r->admin_address);
    *info->mutable_load() = r->load;
    info->set_outstanding(r->outstanding.load());
    info->set_state(r->draining ? "draining" : "ready");
    info->set_last_heartbeat_ms_ago(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - r->last_heartbeat).count());
    info->set_pid(r->pid);
    info->set_cached_blocks(r->cached_block_count.load());
    info->set_requests_routed(r->routed.load());
  }
}

std::vector<v1::KvStoreEndpoint> ReplicaRegistry::KvStores() const {
  std::vector<v1::KvStoreEndpoint> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, r] : replicas_) {
    if (r->role != v1::ROLE_KVSTORE || r->draining) continue;
    v1::KvStoreEndpoint& e = out.emplace_back();
    e.set_instance_name(r->instance_name.empty() ? r->grpc_address : r->instance_name);
    e.set_grpc_address(r->grpc_address);
    e.set_replica_id(id);
  }
  return out;
}

void ApplyKvEvents(const v1::KvCacheEvents& events, std::unordered_set<uint64_t>* cached) {
  if (events.full()) cached->clear();
  for (uint64_t h : events.stored()) cached->insert(h);
  for (uint64_t h : events.removed()) cached->erase(h);
}

int64_t ReplicaRegistry::PrefixOverlap(const Replica& r, std::span<const uint64_t> block_hashes) const {
  std::shared_lock<std::shared_mutex> cache(r.cache_mu);
  int64_t n = 0;
  for (uint64_t h : block_hashes) {
    if (!r.cached_blocks.contains(h)) break;
    ++n;
  }
  return n;
}

namespace {

// A candidate of a pick with the load it reported, copied under the registry's mutex.
struct Candidate {
  ReplicaPtr replica;
  int32_t waiting = 0;
  int64_t kv_blocks_free = 0;
  int32_t running = 0;
  std::vector<int64_t> rank_kv_blocks_free;  // data-parallel replicas: each rank's
};

}  // namespace

ReplicaPtr ReplicaRegistry::Pick(v1::Role role, RoutingPolicy policy, std::span<const uint64_t> block_hashes,
                                 const std::vector<std::string>& exclude, const RoutingWeights& weights) {
  std::vector<Candidate> c;
  size_t two_a = 0, two_b = 0;  // kPowerOfTwo's draws
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, r] : replicas_) {
      if (r->draining || r->role != role) continue;
      if (std::find(exclude.begin(), exclude.end(), id) != exclude.end()) continue;
      c.push_back({r, r->load.waiting(), r->load.kv_blocks_free(), r->load.running(),
                   {r->load.rank_kv_blocks_free().begin(), r->load.rank_kv_blocks_free().end()}});
    }
    if (c.empty()) return nullptr;
    // Round-robin order is the tie-break of every policy, so equal replicas share load.
    const uint64_t turn = rr_[role]++;
    std::rotate(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(turn % c.size()), c.end());
    if (policy == RoutingPolicy::kPowerOfTwo && c.size() >= 2) {
      std::uniform_int_distribution<size_t> pick(0, c.size() - 1);
      two_a = pick(rng_);
      two_b = pick(rng_);
      if (two_b == two_a) two_b = (two_a + 1) % c.size();
    }
  }
  // Load per rank: a data-parallel replica runs D batches of its own sequences at once, so
  // D times one rank's requests load it as much (one rank: the count as it was).
  auto load = [](const Candidate& x) {
    return static_cast<double>(x.replica->outstanding.load() + x.waiting) / LoadRanks(x.rank_kv_blocks_free);
  };
  const Candidate* best = &c[0];
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      break;
    case RoutingPolicy::kLeastOutstanding:
      for (const Candidate& x : c) {
        if (load(x) < load(*best)) best = &x;
      }
      break;
    case RoutingPolicy::kPowerOfTwo:
      if (c.size() >= 2) best = load(c[two_b]) < load(c[two_a]) ? &c[two_b] : &c[two_a];
      break;
    case RoutingPolicy::kCacheAware: {
      double best_score = -1e300;
      for (const Candidate& x : c) {
        const double score = static_cast<double>(PrefixOverlap(*x.replica, block_hashes)) -
                             weights.cache_aware_load_weight * load(x);
        if (score > best_score) {
          best_score = score;
          best = &x;
        }
      }
      break;
    }
    case RoutingPolicy::kKvAware: {
      // Free blocks as last reported, less what this router's requests in flight there
      // will take (about this request's size each), on the one rank the request would
      // land on (KvRoomOnOneRank); then the smaller running batch per rank.
      const double need = static_cast<double>(block_hashes.size() + 1);
      double best_free = -1e300;
      double best_running = 0;
      for (const Candidate& x : c) {
        const double free =
            KvRoomOnOneRank(x.kv_blocks_free, x.rank_kv_blocks_free, x.replica->outstanding.load(), need);
        const double running = static_cast<double>(x.running) / LoadRanks(x.rank_kv_blocks_free);
        if (free > best_free || (free == best_free && running < best_running)) {
          best_free = free;
          best_running = running;
          best = &x;
        }
      }
      break;
    }
  }
  best->replica->routed++;
  return best->replica;
}

}  // namespace tandem
