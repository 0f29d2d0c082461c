// Continuous batching with chunked prefill. Each step takes, in order: every running
// sequence's next tokens (one for a decode, the next chunk for an unfinished prefill),
// then waiting sequences in arrival order, all under a per-step token budget. A newly
// admitted sequence first takes the longest prefix of its prompt the prefix cache holds,
// then blocks for prefix KV imported with it (prefix_kv.h), which the engine copies in.
// When KV blocks run out, the newest running sequences are preempted: their blocks are
// released (published ones stay findable in the prefix cache) and they go back to the
// front of the waiting queue, to be recomputed from their tokens later.
//
// Data-parallel attention (docs/parallel.md): one block manager per rank of the replica's
// group, each over that rank's range of the host pool's blocks (its KV pool). A sequence
// is placed on a rank when it is admitted without blocks (Sequence::dp_rank); its blocks,
// its prefix-cache hits and the preemptions that make room for it stay within that rank's
// pool. Block ids are ids in the one host pool whatever the rank, so that what reads or
// writes a sequence's KV by its block ids (export, import, the kvstore tier) needs no rank.
//
// Pure bookkeeping on the engine thread: no model, no threads, no clock.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <utility>
#include <vector>

#include "engine/runtime/block_manager.h"
#include "engine/runtime/prefix_states.h"
#include "engine/runtime/state_slots.h"
#include "engine/runtime/sequence.h"

namespace tandem {

struct SchedulerOptions {
  int32_t block_size = 64;
  int32_t max_batch_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  int32_t max_running = 64;         // sequences in the running batch
  bool enable_prefix_cache = true;
  uint64_t layout_fingerprint = 0;  // for the block hash chain
  // Slots of the KV pool's per-sequence streams (rings, states; kv_pool.h): 0 when the
  // model has none, else at least max_running. A running sequence holds one
  // (Sequence::state_slot) and gives it back when it stops running (finished, preempted,
  // removed); KV reservations take theirs from the same slots (state_slots()), and a
  // waiting sequence is admitted only while one is free.
  int32_t num_state_slots = 0;
  // With state slots: pool slots [num_state_slots, num_state_slots + num_prefix_states)
  // hold snapshots of those streams at block boundaries (prefix_states.h), without which
  // such a layout cannot reuse a cached prefix. A prompt's snapshots are taken where its
  // last full block ends and, when the prompt fills its blocks exactly, one block
  // earlier (the prefix a resubmitted prompt can use: its last token is always computed),
  // and where the cached blocks it shares end when no snapshot reaches there (a shared
  // system prompt: the second prompt leaves the snapshot the third one uses); a prefill
  // chunk that would cross one of these is cut there.
  int32_t num_prefix_states = 0;
  // Also where a decoding sequence's computed tokens fill a block, one per sequence (each
  // replaces its last; the last stays), so that a conversation's next turn, whose prompt
  // is this prompt and this answer, reuses both. Off where no later prompt comes (a
  // decode-only replica of a disaggregated cluster).
  bool decode_state_snapshots = true;
  // Speculative decoding (docs/speculative-decoding.md): the pool's last layer is the MTP
  // layer's, whose slot e a chunk ending at e writes too, and a sequence drafts up to this
  // many tokens (Sequence::drafts), verified in its next decode chunk. A chunk that reaches
  // a sequence's end holds blocks for 2 x speculative_tokens positions past it (the step's
  // verified drafts and the next drafts' slots). After a prefix-cache hit the first chunk
  // starts one position early (ScheduledChunk::first_kv_cached), for the hidden state the
  // MTP slot after the cached prefix needs.
  bool mtp = false;
  int32_t speculative_tokens = 0;
  // Data-parallel attention: the ranks, each holding num_blocks blocks of the engine's host
  // pool (rank r: ids [r * num_blocks, (r + 1) * num_blocks)). Not with state slots
  // (checked): no such layout runs on ranks.
  int32_t data_parallel_ranks = 1;
};

// A copy of one sequence slot's rows over another (KvPool::CopySequenceSlot).
struct StateCopy {
  int32_t from = -1;
  int32_t to = -1;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start = 0;       // first position computed this step
  int32_t num_tokens = 0;  // positions [start, start + num_tokens), drafts included
  // Speculative decoding: the last num_drafts of those are the sequence's drafts (not in
  // seq->tokens), verified by this step.
  int32_t num_drafts = 0;
  // The first position's KV is cached already (after a prefix hit): computed only for its
  // hidden state (ForwardSequence::first_kv_cached).
  bool first_kv_cached = false;
  bool reaches_end() const { return start + num_tokens - num_drafts == static_cast<int32_t>(seq->tokens.size()); }
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  // Sequences that can never fit the KV cache, removed from the scheduler: the caller
  // ends them with RESOURCE_EXHAUSTED. Their blocks are already released.
  std::vector<std::unique_ptr<Sequence>> rejected;
  int32_t num_preempted = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, int32_t num_blocks);

  // Takes ownership; the sequence waits for admission.
  void Add(std::unique_ptr<Sequence> seq);
  // Adds a sequence whose KV for positions [0, num_computed) is already in `seq->blocks`
  // (imported from a prefill replica), directly into the running batch.
  void AddRunning(std::unique_ptr<Sequence> seq);
  // Removes a sequence (finished or cancelled), releasing its blocks. Null if unknown.
  std::unique_ptr<Sequence> Remove(const std::string& id);

  StepPlan Schedule();
  // After the step's forward pass: marks the chunks computed and offers newly completed
  // full blocks to the prefix cache. Call before sampling appends tokens.
  void OnStepComputed(const StepPlan& plan);
  // The same in two halves, for a step launched before it completes: OnStepLaunched at
  // the launch (the chunks count as computed for scheduling the next step), then, once
  // its results are in, PublishComputed for each of its sequences still around (those
  // preempted meanwhile have nothing computed left to publish).
  void OnStepLaunched(const StepPlan& plan);
  void PublishComputed(Sequence& seq);
  // The state snapshots the last OnStepComputed / PublishComputed asked for: the engine
  // copies each before its slots change again (before the next forward pass).
  std::vector<StateCopy> TakeStateSnapshots() { return std::exchange(state_snapshots_, {}); }
  // After a token was appended to `seq` (or a pending one got its value): extends its
  // block hashes.
  void OnTokenAppended(Sequence& seq);
  // Speculative decoding: after a verify chunk's accepted drafts were appended (with
  // OnTokenAppended), their positions count as computed, and are published.
  void OnDraftsAccepted(Sequence& seq, int32_t accepted);

  Sequence* Find(const std::string& id);
  // Removes every sequence (engine shutdown), releasing their blocks.
  std::vector<std::unique_ptr<Sequence>> TakeAll();
  bool empty() const { return running_.empty() && waiting_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  // Rank 0's pool: the only one without data parallelism.
  BlockManager& blocks() { return *pools_[0]; }
  int32_t num_pools() const { return static_cast<int32_t>(pools_.size()); }
  BlockManager& pool(int32_t rank) { return *pools_[rank]; }
  const BlockManager& pool(int32_t rank) const { return *pools_[rank]; }
  // Data-parallel attention: the sequences placed on `rank` so far (admitted there, imported
  // into its blocks, placed again after a preemption), and those running there now.
  int64_t placed(int32_t rank) const { return placed_[rank]; }
  int32_t running_on(int32_t rank) const;
  // The pool holding seq's blocks.
  BlockManager& PoolOf(const Sequence& seq) { return *pools_[seq.dp_rank]; }
  StateSlots& state_slots() { return state_slots_; }
  PrefixStates& prefix_states() { return prefix_states_; }
  // A cached prefix can be shared: the layout has no per-sequence streams, or their
  // snapshots are kept.
  bool prefix_cache_usable() const {
    return options_.enable_prefix_cache && (options_.num_state_slots == 0 || options_.num_prefix_states > 0);
  }
  const BlockManager& blocks() const { return *pools_[0]; }
  const SchedulerOptions& options() const { return options_; }

  // The rank a KV reservation of `blocks` blocks goes to (its KV is written from outside
  // the replica straight into that rank's blocks): the least loaded with room, by Place's
  // measure; -1 when no rank has room.
  int32_t PlaceReservation(int32_t blocks) const;

  // Blocks needed to hold `tokens` positions.
  int32_t BlocksFor(int64_t tokens) const {
    return static_cast<int32_t>((tokens + options_.block_size - 1) / options_.block_size);
  }

 private:
  bool EnsureBlocks(Sequence& seq, int64_t positions);
  // Chooses seq's rank (it holds no blocks); `hashes` are the blocks its prompt may share.
  void Place(Sequence& seq, std::span<const uint64_t> hashes);
  // The least loaded rank for `blocks` more blocks (of which the cached prefix of `hashes`
  // would be shared), of those with that many free when `needs_room`; -1: none has.
  int32_t LeastLoaded(int64_t blocks, std::span<const uint64_t> hashes, bool needs_room) const;
  // Another running sequence is on seq's rank.
  bool SharesRank(const Sequence& seq) const;
  void Preempt(Sequence& seq);
  void LookUpPrefix(Sequence& seq);
  // Allocates blocks for the part of seq.prefix_kv that continues its cached prefix
  // (sets import_begin/import_end; the engine copies the KV in).
  void ImportPrefix(Sequence& seq, int32_t usable);
  // Layouts with state slots: takes seq.prefix_kv, which brings the state where it ends,
  // when it reaches past the `local` blocks (of `cached`) that have a snapshot here; the
  // blocks are `cached` ones first, then fresh ones the engine copies the import into.
  // False (nothing taken) when it does not help or no blocks are free.
  bool ImportWithState(Sequence& seq, std::span<const uint64_t> hashes, size_t cached, size_t local);
  void ReleaseBlocks(Sequence& seq);
  void TakeStateSlot(Sequence& seq);
  // Positions [seq.num_computed, + n) for this step within `budget`, cut at the prompt's
  // first state snapshot boundary still to take (decode boundaries need no cut).
  int32_t ChunkLength(const Sequence& seq, int32_t budget) const;
  // Positions seq's blocks must cover for a chunk of n tokens (its own, the MTP layer's
  // slots after it, the draft pass's).
  int32_t BlocksNeeded(const Sequence& seq, int32_t n) const;
  // The chunk of n of seq's tokens from num_computed, with a recomputed cached position
  // before them and the drafts after them as they apply.
  ScheduledChunk MakeChunk(Sequence& seq, int32_t n) const;
  // Whether a snapshot of seq's state is due where `position` (a block boundary) is.
  bool IsSnapshotBoundary(const Sequence& seq, int32_t position) const;

  SchedulerOptions options_;
  StateSlots state_slots_;
  PrefixStates prefix_states_;
  std::vector<StateCopy> state_snapshots_;
  std::vector<std::unique_ptr<BlockManager>> pools_;  // one per data-parallel rank
  std::vector<int64_t> placed_;
  std::list<std::unique_ptr<Sequence>> running_;  // oldest first
  std::deque<std::unique_ptr<Sequence>> waiting_;
  uint64_t next_arrival_ = 0;
};

}  // namespace tandem
