// The engine's views for other threads: stats, KV cache events, the KV memory and the
// cached prefix length (engine.h); the engine thread publishes them under the lock.
#include <mutex>
#include <span>
#include <vector>

#include "engine/model/kv_pool.h"
#include "engine/runtime/engine.h"

namespace tandem {

Engine::KvEvents Engine::TakeKvEvents(bool want_full) {
  std::lock_guard<std::mutex> lock(mu_);
  KvEvents out;
  if (events_full_ || want_full) {
    out.full = true;
    out.stored.assign(cached_hashes_.begin(), cached_hashes_.end());
    events_full_ = false;
  } else {
    out.stored.swap(pending_stored_);
    out.removed.swap(pending_removed_);
  }
  pending_stored_.clear();
  pending_removed_.clear();
  return out;
}

void Engine::PublishStats() {
  // Prefix-cache changes since the last call, into the thread-safe mirror. With
  // data-parallel attention the replica's pools together (a hash two ranks hold counts
  // as removed when one of them evicts it: the mirror is a routing hint).
  KvCacheEvents ev;
  EngineStats s = counters_;
  BlockManagerStats bs;
  for (int32_t r = 0; r < scheduler_->num_pools(); ++r) {
    BlockManager& pool = scheduler_->pool(r);
    KvCacheEvents pool_ev = pool.TakeEvents();
    ev.events.insert(ev.events.end(), pool_ev.events.begin(), pool_ev.events.end());
    ev.dropped += pool_ev.dropped;
    s.kv_blocks_total += pool.num_blocks();
    s.kv_blocks_in_use += pool.num_in_use();
    if (scheduler_->num_pools() > 1) {
      s.dp_ranks.push_back({.kv_blocks_total = pool.num_blocks(), .kv_blocks_in_use = pool.num_in_use(),
                            .running = scheduler_->running_on(r), .placed = scheduler_->placed(r)});
    }
    bs.prefix_queries += pool.stats().prefix_queries;
    bs.queried_blocks += pool.stats().queried_blocks;
    bs.hit_blocks += pool.stats().hit_blocks;
    bs.evictions += pool.stats().evictions;
  }
  s.num_waiting = static_cast<int64_t>(scheduler_->num_waiting());
  s.num_running = static_cast<int64_t>(scheduler_->num_running());
  s.kv_usage = s.kv_blocks_total == 0 ? 0.0 : static_cast<double>(s.kv_blocks_in_use) / s.kv_blocks_total;
  const KvLeaseStats ls = leases_->stats();
  s.kv_leases_expired = ls.expired;
  s.kv_writers_refused = ls.writers_refused;
  s.kv_blocks_quarantined = ls.quarantined_blocks;
  s.kv_leases_quarantined = ls.quarantined_leases;
  s.kv_quarantine_stuck = ls.quarantine_stuck;
  s.kv_quarantine_ends_writer_ended = ls.ends_writer_ended;
  s.kv_quarantine_ends_writer_gone = ls.ends_writer_gone;
  s.kv_quarantine_ends_decoded = ls.ends_decoded;
  s.kv_quarantine_ends_no_writer = ls.ends_no_writer;
  s.kv_reserve_waiting = static_cast<int64_t>(kv_waiters_.size());
  s.prefix_cache_queries = bs.prefix_queries;
  s.prefix_cache_queried_blocks = bs.queried_blocks;
  s.prefix_cache_hit_blocks = bs.hit_blocks;
  s.prefix_cache_evictions = bs.evictions;
  s.prefix_state_snapshots = scheduler_->prefix_states().num_held();
  s.prefix_state_evictions = scheduler_->prefix_states().evictions();
  const ConstraintCompiler::Stats cs = constraints_->stats();
  s.constraints_compiled = static_cast<int64_t>(cs.compiled);
  s.constraints_failed = static_cast<int64_t>(cs.failed);
  s.constraint_cache_hits = static_cast<int64_t>(cs.cache_hits);
  s.constraint_compile_seconds = cs.compile_seconds;
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = s;
  constexpr size_t kMaxPendingEvents = 1 << 16;
  if (ev.dropped > 0) {
    // The block manager lost events: rebuild the mirror from its current contents.
    cached_hashes_.clear();
    for (int32_t r = 0; r < scheduler_->num_pools(); ++r) {
      for (uint64_t h : scheduler_->pool(r).CachedHashes()) cached_hashes_.insert(h);
    }
    events_full_ = true;
    return;
  }
  for (const KvCacheEvent& e : ev.events) {
    if (e.kind == KvCacheEvent::Kind::kStored) {
      cached_hashes_.insert(e.hash);
      if (!events_full_) pending_stored_.push_back(e.hash);
    } else {
      cached_hashes_.erase(e.hash);
      if (!events_full_) pending_removed_.push_back(e.hash);
    }
  }
  if (pending_stored_.size() + pending_removed_.size() > kMaxPendingEvents) events_full_ = true;
}

Engine::KvMemory Engine::kv_memory() const {
  if (cache_ == nullptr) {
    const KvPool::Geometry& g = pool_->geometry();
    std::span<std::byte> m = pool_->memory();
    return {.base = reinterpret_cast<float*>(m.data()), .bytes = m.size(), .num_layers = g.num_layers,
            .num_blocks = g.num_blocks, .block_size = g.block_size, .entry_dim = 0,
            .num_state_slots = g.num_sequence_slots};
  }
  std::span<float> d = cache_->data();
  return {.base = d.data(), .bytes = d.size() * sizeof(float), .num_layers = cache_->num_layers(),
          .num_blocks = cache_->num_blocks(), .block_size = cache_->block_size(), .entry_dim = cache_->entry_dim()};
}

int32_t Engine::CachedPrefixLength(std::span<const uint64_t> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t n = 0;
  for (uint64_t h : hashes) {
    if (!cached_hashes_.contains(h)) break;
    ++n;
  }
  return n;
}

int32_t Engine::CachedStatePrefixLength(std::span<const uint64_t> hashes) const {
  if (latent_layout_) return CachedPrefixLength(hashes);
  std::lock_guard<std::mutex> lock(mu_);
  int32_t n = 0, usable = 0;
  for (uint64_t h : hashes) {
    if (!cached_hashes_.contains(h)) break;
    ++n;
    if (snapshot_hashes_.contains(h)) usable = n;
  }
  return usable;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace tandem
