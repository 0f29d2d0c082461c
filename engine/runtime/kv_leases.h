// The decode side's KV reservations (leases), the writers recorded on them, and the
// quarantine of leases a writer may still be writing into.
//
// A reservation's blocks are written by a prefill replica from outside this process (UCX
// puts, a copy into shared memory, a CUDA IPC copy), and nothing here can stop such a
// writer: a process stopped mid-copy resumes where it was. So blocks are never handed to
// anyone else while a writer may still write into them, and what decides it is proof, not
// time:
//   - A writer writes only after BeginWrites recorded it on the live lease (the prefill
//     replica waits for that answer before its first write), so a lease with no writer
//     recorded has nobody writing into it, and once a lease is no longer live nobody new
//     can start.
//   - A recorded writer stays open until it is known to have stopped: its own EndWrites
//     (sent once its writes completed), the Decode call that follows its answered Prefill
//     call (it answers only after its writes completed), its process saying it holds no
//     writes for the lease, or its process provably gone (the last two are a prober's
//     findings, services/decode/kv_writer_prober.h).
// A lease that ends unused (it expires, is released, or a Decode finds another writer
// open) is freed at once when no writer is open; else it is quarantined: still allocated,
// counted in use, until its last open writer stopped. No time bound frees a quarantine;
// one older than `stuck_seconds` is only counted (KvLeaseStats::quarantine_stuck).
//
// The engine thread owns it: every method is called there, except BeginWrites, which may
// be called from any thread (a writer's announcement is answered at once, not after the
// engine's step in flight; it touches no block). Times are the caller's clock (seconds).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/block_manager.h"
#include "engine/runtime/state_slots.h"

namespace tandem {

// A process writing into a lease, as its BeginWrites named it.
struct KvWriter {
  std::string address;       // where it answers Prefill.WriterState
  uint64_t incarnation = 0;  // its process (random per process start)
};

// How a writer, and with the last open one a quarantine, was known to have stopped.
enum class KvWriterProof {
  kEnded,    // its EndWrites, or its process answering that it holds no writes for the lease
  kGone,     // its process is gone (another process answers at its address, or none listens)
  kDecoded,  // the Decode (or Release) that follows its answered Prefill call
};

// Told when leases go into and out of quarantine. Called on the engine thread: must not
// block.
class KvQuarantineListener {
 public:
  virtual ~KvQuarantineListener() = default;
  // `open`: the writers not known to have stopped (at least one).
  virtual void OnQuarantined(const std::string& lease_id, uint64_t token, const std::vector<KvWriter>& open) = 0;
  virtual void OnQuarantineEnded(const std::string& lease_id, uint64_t token) = 0;
};

struct KvLeaseStats {
  int64_t expired = 0;          // leases that expired unused
  int64_t writers_refused = 0;  // BeginWrites on a lease that was not live
  // Quarantines ended, by the proof that ended them; and expired leases freed at once
  // because no writer was open (none began, or all had ended).
  int64_t ends_writer_ended = 0;
  int64_t ends_writer_gone = 0;
  int64_t ends_decoded = 0;
  int64_t ends_no_writer = 0;
  int64_t quarantined_blocks = 0;  // now
  int64_t quarantined_leases = 0;  // now
  int64_t quarantine_stuck = 0;    // quarantined for longer than stuck_seconds, now
};

class KvLeases {
 public:
  // `blocks` must outlive this object. Tokens count up from `first_token` (a random number
  // in the engine, so that two processes' tokens do not meet).
  // `slots` (null: the layout has no per-sequence streams) too.
  KvLeases(BlockManager* blocks, double lease_seconds, double stuck_seconds, uint64_t first_token = 1,
           StateSlots* slots = nullptr)
      : KvLeases(std::vector<BlockManager*>{blocks}, lease_seconds, stuck_seconds, first_token, slots) {}
  // Over the pools of a data-parallel replica's ranks (scheduler.h): each reservation is
  // made in the pool of one rank, the sequence's rank once it takes the blocks.
  KvLeases(std::vector<BlockManager*> pools, double lease_seconds, double stuck_seconds, uint64_t first_token = 1,
           StateSlots* slots = nullptr)
      : pools_(std::move(pools)), slots_(slots), lease_seconds_(lease_seconds), stuck_seconds_(stuck_seconds),
        next_token_(first_token) {}

  // Null: nobody is told. Called with this object's lock held (it must not call back), so
  // once this returns the previous listener is called no more. Any thread.
  void set_listener(KvQuarantineListener* listener) {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
  }

  struct Reservation {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;
    uint64_t token = 0;  // never 0
    int32_t state_slot = -1;  // the sequence slot its rings and states are written into (or -1)
    int32_t rank = 0;  // the data-parallel rank whose pool holds the blocks
  };

  // Whether `id` holds a reservation, live or quarantined (an id in use).
  bool Contains(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return ContainsLocked(id);
  }
  // Reserves `num_blocks` blocks for `num_tokens` tokens under `id` until now + the lease,
  // and a sequence slot when the leases have slots. RESOURCE_EXHAUSTED when the block
  // manager has too few blocks or no slot is free; INVALID_ARGUMENT for an id in use.
  // `rank`: whose pool (the first's without data parallelism).
  absl::StatusOr<Reservation> Reserve(const std::string& id, int32_t num_blocks, int32_t num_tokens, double now,
                                      int32_t rank = 0);
  // The live reservation of `id` (null: none, or no longer live). Valid until the next call
  // on the owner thread.
  const Reservation* Find(const std::string& id) const;
  // Records `writer` on the live reservation `id` of `token`: from now on it may write.
  // FAILED_PRECONDITION when there is none (expired, released, taken, never made, another
  // token): it must not write. INVALID_ARGUMENT for a writer without address or incarnation.
  // Any thread.
  absl::Status BeginWrites(const std::string& id, uint64_t token, const KvWriter& writer);
  // One write session of writer `incarnation` on `id` (token 0: whichever reservation
  // holds `id`) ended, known by `proof`; with the last open writer of a quarantined lease
  // the quarantine ends. Unknown leases and writers are ignored (their quarantine ended).
  void EndWrites(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof);
  // Every write session of writer `incarnation` on `id` ended (its process holds none for
  // the lease, or is gone).
  void WriterStopped(const std::string& id, uint64_t token, uint64_t incarnation, KvWriterProof proof);
  // Hands a live reservation's blocks to its sequence (the lease ends, the blocks stay
  // allocated), with `ended_writer` (an incarnation, 0: none) known to be done: the writer
  // whose Prefill call answered. FAILED_PRECONDITION when `id` has no live reservation, or
  // another writer of it is still open (the lease then goes into quarantine).
  absl::StatusOr<Reservation> Take(const std::string& id, uint64_t ended_writer, double now);
  // The lease will not be used (the router's Release, a failed Decode): freed when no
  // writer is open, else quarantined. A quarantined `id` stays so. False when `id` holds
  // nothing.
  bool Release(const std::string& id, double now);
  // Frees or quarantines the leases expired by `now`; counts quarantines grown stuck.
  void Tick(double now);
  // When Tick has something to do next (+infinity: nothing pending).
  double NextDeadline() const;
  // Frees everything (shutdown: no peer writes into a pool that is going away matter).
  void ReleaseAll();

  KvLeaseStats stats() const;
  bool empty() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.empty() && quarantined_.empty();
  }

 private:
  struct Writer {
    KvWriter w;
    int open = 0;  // write sessions begun and not ended
  };
  struct Held {
    Reservation r;
    double until = 0;  // live: the lease's end
    double since = 0;  // quarantined: since when
    bool stuck = false;
    std::vector<Writer> writers;
  };
  using Leases = std::map<std::string, Held>;
  bool ContainsLocked(const std::string& id) const { return live_.contains(id) || quarantined_.contains(id); }
  static bool AnyOpen(const Held& h);
  static Writer* FindWriter(Held& h, uint64_t incarnation);
  // A live lease that ended unused: freed (no writer open) or quarantined.
  void EndLive(Leases::iterator it, double now);
  // Ends the quarantine of `it` when no writer is open any more.
  void MaybeEndQuarantine(Leases::iterator it, KvWriterProof proof);
  // The lease `id` of `token` (0: any), live or quarantined, and which map holds it.
  Held* Lookup(const std::string& id, uint64_t token, bool* quarantined);

  // Gives back a reservation's blocks and slot.
  void Free(const Reservation& r);

  std::vector<BlockManager*> pools_;
  StateSlots* slots_;
  const double lease_seconds_;
  const double stuck_seconds_;
  // Guards everything below; held only for map work (and the listener's calls, which
  // only queue).
  mutable std::mutex mu_;
  uint64_t next_token_;
  KvQuarantineListener* listener_ = nullptr;
  Leases live_;
  Leases quarantined_;
  int64_t quarantined_blocks_ = 0;
  KvLeaseStats counts_;
};

}  // namespace tandem
