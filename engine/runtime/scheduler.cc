#include "engine/runtime/scheduler.h"

#include <algorithm>

#include "engine/runtime/block_hash.h"
#include "kernels/common/check.h"

namespace tandem {

Scheduler::Scheduler(const SchedulerOptions& options, int32_t num_blocks)
    : options_(options),
      state_slots_(options.num_state_slots),
      prefix_states_(options.num_state_slots, options.num_state_slots > 0 ? options.num_prefix_states : 0) {
  TANDEM_CHECK(options_.block_size > 0 && options_.max_batch_tokens > 0 && options_.max_running > 0);
  TANDEM_CHECK_GE(options_.data_parallel_ranks, 1);
  TANDEM_CHECK(options_.data_parallel_ranks == 1 || options_.num_state_slots == 0);
  placed_.assign(static_cast<size_t>(options_.data_parallel_ranks), 0);
  // Rank r's blocks are ids [r * num_blocks, (r + 1) * num_blocks) of the one host pool.
  for (int32_t r = 0; r < options_.data_parallel_ranks; ++r) {
    pools_.push_back(
        std::make_unique<BlockManager>(num_blocks, BlockManager::kDefaultMaxPendingEvents, r * num_blocks));
  }
  TANDEM_CHECK(options_.num_state_slots == 0 || options_.num_state_slots >= options_.max_running);
  TANDEM_CHECK_GE(options_.num_prefix_states, 0);
}

void Scheduler::TakeStateSlot(Sequence& seq) {
  if (options_.num_state_slots == 0 || seq.state_slot >= 0) return;
  seq.state_slot = state_slots_.Take();
  TANDEM_CHECK_GE(seq.state_slot, 0) << "more running sequences than state slots";
}

void Scheduler::Add(std::unique_ptr<Sequence> seq) {
  seq->state = SequenceState::kWaiting;
  seq->arrival = next_arrival_++;
  ExtendBlockHashes(seq->tokens, options_.block_size, options_.layout_fingerprint, &seq->block_hashes);
  waiting_.push_back(std::move(seq));
}

void Scheduler::AddRunning(std::unique_ptr<Sequence> seq) {
  seq->state = SequenceState::kRunning;
  TakeStateSlot(*seq);
  seq->arrival = next_arrival_++;
  seq->prefix_looked_up = true;
  ExtendBlockHashes(seq->tokens, options_.block_size, options_.layout_fingerprint, &seq->block_hashes);
  ++placed_[seq->dp_rank];
  running_.push_back(std::move(seq));
}

std::unique_ptr<Sequence> Scheduler::Remove(const std::string& id) {
  std::unique_ptr<Sequence> out;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id == id) {
      out = std::move(*it);
      running_.erase(it);
      break;
    }
  }
  if (!out) {
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        out = std::move(*it);
        waiting_.erase(it);
        break;
      }
    }
  }
  if (out) ReleaseBlocks(*out);
  return out;
}

Sequence* Scheduler::Find(const std::string& id) {
  for (auto& s : running_) {
    if (s->id == id) return s.get();
  }
  for (auto& s : waiting_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::TakeAll() {
  std::vector<std::unique_ptr<Sequence>> all;
  for (auto& s : running_) all.push_back(std::move(s));
  for (auto& s : waiting_) all.push_back(std::move(s));
  running_.clear();
  waiting_.clear();
  for (auto& s : all) ReleaseBlocks(*s);
  return all;
}

void Scheduler::ReleaseBlocks(Sequence& seq) {
  PoolOf(seq).Release(seq.blocks);
  seq.blocks.clear();
  seq.num_published = 0;
  seq.num_computed = 0;
  seq.import_begin = seq.import_end = 0;
  seq.import_state = false;
  seq.drafts.clear();
  seq.recompute_last_cached = false;
  if (seq.state_slot >= 0) {
    state_slots_.Release(seq.state_slot);
    seq.state_slot = -1;
  }
  if (seq.restore_state_from >= 0) {
    prefix_states_.Unpin(seq.restore_state_from);
    seq.restore_state_from = -1;
  }
}

bool Scheduler::EnsureBlocks(Sequence& seq, int64_t positions) {
  const int32_t need = BlocksFor(positions) - static_cast<int32_t>(seq.blocks.size());
  if (need <= 0) return true;
  BlockManager& blocks = PoolOf(seq);
  if (!blocks.CanAllocate(need)) return false;
  absl::StatusOr<std::vector<int32_t>> got = blocks.Allocate(need);
  TANDEM_CHECK(got.ok()) << got.status();
  seq.blocks.insert(seq.blocks.end(), got->begin(), got->end());
  return true;
}

void Scheduler::Preempt(Sequence& seq) {
  ReleaseBlocks(seq);
  seq.prefix_looked_up = false;
  seq.metrics.preemptions++;
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == &seq) {
      std::unique_ptr<Sequence> s = std::move(*it);
      running_.erase(it);
      s->state = SequenceState::kWaiting;
      waiting_.push_front(std::move(s));
      return;
    }
  }
  TANDEM_CHECK(false) << "preempting a sequence that is not running: " << seq.id;
}

bool Scheduler::SharesRank(const Sequence& seq) const {
  for (const auto& s : running_) {
    if (s.get() != &seq && s->dp_rank == seq.dp_rank) return true;
  }
  return false;
}

int32_t Scheduler::LeastLoaded(int64_t blocks, std::span<const uint64_t> hashes, bool needs_room) const {
  // The rank that would hold the fewest blocks once these are in: its blocks in use plus
  // those it would take there (less the cached prefix it would share there, so that a
  // repeated prefix tends to return to its rank while the ranks' loads stay close); then
  // the fewest running sequences; then the lowest rank. Load is known here without asking
  // the ranks, and the choice is the same for the same history.
  std::vector<int32_t> running(pools_.size(), 0);
  for (const auto& s : running_) ++running[s->dp_rank];
  int32_t best = -1;
  int64_t best_load = INT64_MAX;
  for (int32_t r = 0; r < num_pools(); ++r) {
    if (needs_room && pools_[r]->num_free() < blocks) continue;
    const int64_t cached = prefix_cache_usable() ? pools_[r]->CachedPrefixLength(hashes) : 0;
    const int64_t load = pools_[r]->num_in_use() + blocks - cached;
    if (best < 0 || load < best_load || (load == best_load && running[r] < running[best])) {
      best = r;
      best_load = load;
    }
  }
  return best;
}

void Scheduler::Place(Sequence& seq, std::span<const uint64_t> hashes) {
  TANDEM_CHECK(seq.blocks.empty());
  // (Every rank's blocks are ids in the one host pool: KV that crosses the replica's
  // boundary, a prefix imported with the request or a prefill exported to a decode
  // replica, is read and written by them whatever the rank.)
  seq.dp_rank = pools_.size() == 1 ? 0 : LeastLoaded(BlocksFor(static_cast<int64_t>(seq.tokens.size())), hashes,
                                                     /*needs_room=*/false);
  ++placed_[seq.dp_rank];
}

int32_t Scheduler::running_on(int32_t rank) const {
  int32_t n = 0;
  for (const auto& s : running_) n += s->dp_rank == rank;
  return n;
}

int32_t Scheduler::PlaceReservation(int32_t blocks) const {
  return pools_.size() == 1 ? (pools_[0]->num_free() >= blocks ? 0 : -1)
                            : LeastLoaded(blocks, {}, /*needs_room=*/true);
}

void Scheduler::LookUpPrefix(Sequence& seq) {
  seq.prefix_looked_up = true;
  TANDEM_CHECK(seq.blocks.empty() && seq.num_computed == 0);
  // At least the last token is computed: its logits are what the step is for.
  const size_t usable = std::min(seq.block_hashes.size(), (seq.tokens.size() - 1) / options_.block_size);
  const std::span<const uint64_t> hashes(seq.block_hashes.data(), usable);
  Place(seq, hashes);
  BlockManager& pool = PoolOf(seq);
  if (prefix_cache_usable() && options_.num_state_slots == 0) {
    seq.blocks = pool.AcquireCachedPrefix(hashes);
  } else if (prefix_cache_usable()) {
    // The longest cached prefix whose last block has a state snapshot. Where the cached
    // blocks reach further, this sequence's state is snapshotted where they end.
    const size_t cached = static_cast<size_t>(pool.CachedPrefixLength(hashes));
    size_t k = cached;
    while (k > 0 && !prefix_states_.Contains(hashes[k - 1])) --k;
    if (!ImportWithState(seq, hashes, cached, k)) {
      seq.shared_prefix_end = cached > k ? static_cast<int32_t>(cached) * options_.block_size : 0;
      seq.blocks = pool.AcquireCachedPrefix(hashes, k);
      TANDEM_CHECK_EQ(seq.blocks.size(), k);
      if (k > 0) seq.restore_state_from = prefix_states_.Acquire(hashes[k - 1]);
      seq.num_published = static_cast<int32_t>(seq.blocks.size());
    }
  }
  if (options_.num_state_slots == 0) {
    seq.num_published = static_cast<int32_t>(seq.blocks.size());
    ImportPrefix(seq, static_cast<int32_t>(usable));
  }
  seq.num_computed = static_cast<int32_t>(seq.blocks.size()) * options_.block_size;
  // The MTP slot after a cached prefix needs the hidden state of its last position.
  seq.recompute_last_cached = options_.mtp && seq.num_computed > 0;
  if (seq.first_scheduled_at < 0) {
    seq.metrics.cached_prompt_tokens = std::min(seq.num_computed, seq.prompt_len);
    seq.metrics.imported_prompt_tokens = (seq.import_end - seq.import_begin) * options_.block_size;
  }
}

void Scheduler::ImportPrefix(Sequence& seq, int32_t usable) {
  seq.import_begin = seq.import_end = 0;
  if (!seq.prefix_kv) return;
  // The import continues the locally cached prefix: it needs every block before its first
  // one, and brings only the blocks beyond what the local cache already gave.
  const PrefixKv& p = *seq.prefix_kv;
  const int32_t have = static_cast<int32_t>(seq.blocks.size());
  const int32_t end = std::min(p.first_block + static_cast<int32_t>(p.hashes.size()), usable);
  BlockManager& pool = PoolOf(seq);
  if (have < p.first_block || end <= have || !pool.CanAllocate(end - have)) return;
  absl::StatusOr<std::vector<int32_t>> got = pool.Allocate(end - have);
  TANDEM_CHECK(got.ok()) << got.status();
  seq.blocks.insert(seq.blocks.end(), got->begin(), got->end());
  seq.import_begin = have;
  seq.import_end = end;
}

bool Scheduler::ImportWithState(Sequence& seq, std::span<const uint64_t> hashes, size_t cached, size_t local) {
  seq.import_begin = seq.import_end = 0;
  seq.import_state = false;
  if (!seq.prefix_kv || seq.prefix_kv->state.empty()) return false;
  // Worth it when the import's state reaches past the local snapshot; usable when every
  // block before it is cached here. Cached blocks the import also brings are shared, not
  // copied; its state replaces a snapshot.
  const PrefixKv& p = *seq.prefix_kv;
  const size_t end = static_cast<size_t>(p.end_block());
  if (end <= local || end > hashes.size() || cached < static_cast<size_t>(p.first_block)) return false;
  const size_t shared = std::min(cached, end);
  BlockManager& pool = PoolOf(seq);
  std::vector<int32_t> blocks = pool.AcquireCachedPrefix(hashes, shared);
  TANDEM_CHECK_EQ(blocks.size(), shared);
  const int32_t fresh = static_cast<int32_t>(end - shared);
  if (!pool.CanAllocate(fresh)) {
    pool.Release(blocks);
    return false;
  }
  absl::StatusOr<std::vector<int32_t>> got = pool.Allocate(fresh);
  TANDEM_CHECK(got.ok()) << got.status();
  blocks.insert(blocks.end(), got->begin(), got->end());
  seq.blocks = std::move(blocks);
  seq.num_published = static_cast<int32_t>(shared);
  seq.import_begin = static_cast<int32_t>(shared);
  seq.import_end = static_cast<int32_t>(end);
  seq.import_state = true;
  // Cached blocks beyond the import: this sequence's state is snapshotted where they end.
  seq.shared_prefix_end = cached > end ? static_cast<int32_t>(cached) * options_.block_size : 0;
  return true;
}

bool Scheduler::IsSnapshotBoundary(const Sequence& seq, int32_t position) const {
  const int32_t bs = options_.block_size;
  if (options_.num_state_slots == 0 || !prefix_cache_usable() || position <= 0 || position % bs != 0) return false;
  // In the prompt: where its last full block ends, its end, where shared cached blocks end;
  // past it (decoding, or recomputing generated tokens): every block boundary.
  const int32_t last_full = (seq.prompt_len - 1) / bs * bs;
  if (position > seq.prompt_len ? !options_.decode_state_snapshots
                                : position != last_full && position != seq.prompt_len &&
                                      position != seq.shared_prefix_end) {
    return false;
  }
  const size_t block = static_cast<size_t>(position / bs) - 1;
  return block < seq.block_hashes.size() && !prefix_states_.Contains(seq.block_hashes[block]);
}

int32_t Scheduler::BlocksNeeded(const Sequence& seq, int32_t n) const {
  const int32_t end = seq.num_computed + n;
  if (!options_.mtp) return end;
  // The MTP slot `end` (its token known), or the draft pass's slots past the end.
  return end < static_cast<int32_t>(seq.tokens.size()) ? end + 1 : end + 2 * options_.speculative_tokens;
}

ScheduledChunk Scheduler::MakeChunk(Sequence& seq, int32_t n) const {
  ScheduledChunk c{.seq = &seq, .start = seq.num_computed, .num_tokens = n};
  if (seq.recompute_last_cached) {
    c.start -= 1;
    c.num_tokens += 1;
    c.first_kv_cached = true;
  }
  // A decode step verifies the drafts it has room for.
  if (c.reaches_end() && n == 1 && !seq.drafts.empty()) {
    c.num_drafts = static_cast<int32_t>(seq.drafts.size());
    c.num_tokens += c.num_drafts;
  }
  return c;
}

int32_t Scheduler::ChunkLength(const Sequence& seq, int32_t budget) const {
  // (A chunk after a prefix hit also recomputes the last cached position.)
  if (seq.recompute_last_cached) --budget;
  int32_t n = std::min<int32_t>(static_cast<int32_t>(seq.tokens.size()) - seq.num_computed, budget);
  if (options_.num_state_slots == 0 || !prefix_cache_usable()) return n;
  // The first due boundary (ascending) strictly inside the chunk.
  const int32_t last_full = (seq.prompt_len - 1) / options_.block_size * options_.block_size;
  for (const int32_t p : {seq.shared_prefix_end, last_full, seq.prompt_len}) {
    if (p > seq.num_computed && p < seq.num_computed + n && IsSnapshotBoundary(seq, p)) return p - seq.num_computed;
  }
  return n;
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  int32_t budget = options_.max_batch_tokens;

  // Running sequences, oldest first; a sequence short of blocks preempts the newest ones.
  std::vector<Sequence*> order;
  for (auto& s : running_) order.push_back(s.get());
  std::vector<bool> gone(order.size(), false);
  for (size_t i = 0; i < order.size() && budget > 0; ++i) {
    if (gone[i]) continue;
    Sequence& seq = *order[i];
    // Drafts beyond the step's budget wait (they are dropped: the next draft pass makes more).
    if (!seq.drafts.empty() && static_cast<int32_t>(seq.drafts.size()) + 1 > budget) {
      seq.drafts.resize(static_cast<size_t>(std::max(0, budget - 1)));
    }
    const int32_t n = ChunkLength(seq, budget);
    TANDEM_CHECK_GE(n, 1);
    bool fits = EnsureBlocks(seq, BlocksNeeded(seq, n));
    for (size_t j = order.size(); !fits && j-- > i + 1;) {
      // (Only a sequence of the same pool makes room in it.)
      if (gone[j] || order[j]->dp_rank != seq.dp_rank) continue;
      Preempt(*order[j]);
      gone[j] = true;
      ++plan.num_preempted;
      fits = EnsureBlocks(seq, BlocksNeeded(seq, n));
    }
    if (!fits) {
      const int32_t needed = BlocksFor(BlocksNeeded(seq, n));
      if (!SharesRank(seq) && needed > PoolOf(seq).num_blocks()) {
        // It can never fit, even with the cache to itself.
        std::unique_ptr<Sequence> s = Remove(seq.id);
        plan.rejected.push_back(std::move(s));
      } else {
        Preempt(seq);
        ++plan.num_preempted;
      }
      gone[i] = true;
      continue;
    }
    plan.chunks.push_back(MakeChunk(seq, n));
    budget -= plan.chunks.back().num_tokens;
  }

  // Waiting sequences, in order, while budget, batch room and blocks allow.
  // (Reservations hold sequence slots too: one must be free.)
  while (budget > 0 && !waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_running &&
         (options_.num_state_slots == 0 || state_slots_.num_free() > 0)) {
    Sequence& seq = *waiting_.front();
    // A sequence preempted while its last token is still being chosen: its prompt for the
    // recomputation is not known yet (and its hashes are not extended): admitted later.
    if (seq.pending_token) break;
    if (!seq.prefix_looked_up) LookUpPrefix(seq);
    const int32_t n = ChunkLength(seq, budget);
    if (n < 1) break;  // (a recomputed cached position took the last of the budget)
    if (!EnsureBlocks(seq, BlocksNeeded(seq, n))) {
      if (!SharesRank(seq) && BlocksFor(BlocksNeeded(seq, n)) > PoolOf(seq).num_blocks()) {
        std::unique_ptr<Sequence> s = std::move(waiting_.front());
        waiting_.pop_front();
        ReleaseBlocks(*s);
        plan.rejected.push_back(std::move(s));
        continue;
      }
      // Hold no cache blocks while waiting: others may need them to finish.
      ReleaseBlocks(seq);
      seq.prefix_looked_up = false;
      break;
    }
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->state = SequenceState::kRunning;
    TakeStateSlot(*s);
    plan.chunks.push_back(MakeChunk(*s, n));
    budget -= plan.chunks.back().num_tokens;
    running_.push_back(std::move(s));
  }
  return plan;
}

void Scheduler::OnStepComputed(const StepPlan& plan) {
  OnStepLaunched(plan);
  for (const ScheduledChunk& c : plan.chunks) PublishComputed(*c.seq);
}

void Scheduler::OnStepLaunched(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    // Drafts count once accepted (OnDraftsAccepted).
    c.seq->num_computed = c.start + c.num_tokens - c.num_drafts;
    c.seq->recompute_last_cached = false;
    if (c.num_drafts > 0) c.seq->drafts.clear();
  }
}

void Scheduler::OnDraftsAccepted(Sequence& seq, int32_t accepted) {
  TANDEM_CHECK_LE(seq.num_computed + accepted, static_cast<int32_t>(seq.tokens.size()) - 1) << seq.id;
  seq.num_computed += accepted;
  PublishComputed(seq);
}

void Scheduler::PublishComputed(Sequence& seq) {
  const int32_t full = seq.num_computed / options_.block_size;
  while (seq.num_published < full && seq.num_published < static_cast<int32_t>(seq.block_hashes.size())) {
    if (prefix_cache_usable()) {
      PoolOf(seq).Publish(seq.blocks[seq.num_published], seq.block_hashes[seq.num_published]);
    }
    ++seq.num_published;
  }
  // The state where this prefix ends, for a later hit on it (prefix_states.h).
  if (seq.state_slot < 0 || !IsSnapshotBoundary(seq, seq.num_computed)) return;
  const uint64_t h = seq.block_hashes[seq.num_computed / options_.block_size - 1];
  const int32_t slot = prefix_states_.Put(h);
  if (slot < 0) return;
  state_snapshots_.push_back({.from = seq.state_slot, .to = slot});
  if (seq.num_computed > seq.prompt_len) {
    // Past the prompt, a sequence keeps one: each replaces its last.
    if (seq.decode_snapshot_hash != 0) prefix_states_.Forget(seq.decode_snapshot_hash);
    seq.decode_snapshot_hash = h;
  }
}

void Scheduler::OnTokenAppended(Sequence& seq) {
  // Not over a pending placeholder (the next step, launched before this token's output,
  // may have appended one): its block is hashed once its value is in.
  std::span<const int32_t> known(seq.tokens);
  if (seq.pending_token) known = known.first(known.size() - 1);
  ExtendBlockHashes(known, options_.block_size, options_.layout_fingerprint, &seq.block_hashes);
}

}  // namespace tandem
