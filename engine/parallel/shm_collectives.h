// The CPU backend of Collectives: the processes of one machine, over one named segment of
// shared memory (docs/parallel.md step 1).
//
//   ShmGroupOptions opt{.name = "replica-7", .world_size = 4, .rank = r};
//   absl::StatusOr<std::unique_ptr<ShmCollectives>> group = ShmCollectives::Open(opt);
//   ... (*group)->AllReduceSum(data) ...
//
// Rank 0 creates the segment (removing a leftover of the same name first), the others
// join it; Open returns on every rank once all have joined, and rank 0 then unlinks the
// name at once (the ranks keep their mappings), so a crash later leaves nothing in
// /dev/shm. The name must be unique among the groups alive on the machine.
//
// How it moves data. Each rank owns two slots (`slot_bytes` of data each) in the segment.
// An operation is a sequence of rounds: in each round every rank writes its part into its
// slot of that round's parity, arrives at the round's barrier, then reads what it needs
// from the others' slots. With two slots a rank can fill the next round while a slower
// peer still reads this one, so one barrier per round suffices. Messages larger than a
// slot go in chunks, one round each. AllReduceSum has each rank sum every element in rank
// order (small messages, or two ranks: one round per chunk), or reduce a 1/W share of each
// chunk and then gather the shares (two rounds per chunk, W times less reading).
//
// How it waits. The barrier is one counter in the segment (std::atomic, lock-free,
// incremented once per rank per round). A waiter spins briefly (only when every rank can
// have a CPU to itself: on an oversubscribed machine spinning takes the time the missing
// peer needs), then sleeps on the counter with a shared futex (no FUTEX_PRIVATE_FLAG: the
// word is in a mapping shared between processes); the last rank to arrive wakes the
// sleepers. A futex, rather than spin/yield/sleep, wakes a sleeper in microseconds and
// costs nothing while a rank waits for a slow step. Sleeps last at most 10 ms, after which
// the waiter checks the group's failure record, its deadline and whether the ranks it
// waits for are still alive (pid and start time, recorded at the join).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/collectives.h"
#include "engine/parallel/shm_segment.h"

namespace tandem::parallel {

inline constexpr int kShmMaxWorld = 64;

struct ShmGroupOptions {
  // The segment: /dev/shm/tandem-<name>, or <directory>/tandem-<name> (shm_segment.h).
  std::string name;
  std::string directory;
  int world_size = 0;  // 1 to kShmMaxWorld
  int rank = -1;
  // Data bytes of each of a rank's two slots: the chunk size of every operation. At least
  // 4096, a multiple of 64; every rank must give the same.
  size_t slot_bytes = size_t{1} << 20;
  // How long a rank waits for the others: to join (rank 0 included: a joiner waits for it
  // to create the segment), and at each round of an operation. Infinite is allowed (dead
  // peers are still detected); a rank waiting for work (the step plan) longer than this
  // needs the work's sender to send an empty message now and then.
  absl::Duration timeout = absl::Seconds(60);
  // How long a waiter spins before it sleeps. Unset: 20 us when the group's ranks fit the
  // CPUs this process may run on, else 0.
  std::optional<absl::Duration> spin;
};

class ShmCollectives final : public Collectives {
 public:
  // Creates (rank 0) or joins (the others) the group and returns once every rank has
  // joined. A joiner ignores a leftover segment of a crashed run (its rank 0 is dead) and
  // waits for the new one. Errors: INVALID_ARGUMENT for bad options, or options that
  // differ from rank 0's; DEADLINE_EXCEEDED when a rank does not join within the timeout;
  // UNAVAILABLE when a rank dies during the join; ALREADY_EXISTS when another live process
  // holds this rank; INTERNAL for system errors.
  static absl::StatusOr<std::unique_ptr<ShmCollectives>> Open(const ShmGroupOptions& options);

  // Leaves the group: peers still waiting for this rank end with UNAVAILABLE. Rank 0
  // unlinks the name if the join did not get that far.
  ~ShmCollectives() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  absl::Status AllReduceSum(std::span<float> data) override;
  absl::Status AllGather(std::span<const std::byte> send, std::span<std::byte> recv) override;
  absl::Status AllToAll(std::span<const std::span<const std::byte>> send,
                        std::span<std::byte> recv, std::span<size_t> recv_sizes) override;
  absl::Status Broadcast(std::span<std::byte> data, int root) override;
  absl::Status Barrier() override;

  const std::string& segment_path() const { return segment_->path(); }

  struct Layout;  // the segment's header (shm_collectives.cc)
  enum class Op : uint32_t;

 private:
  ShmCollectives(const ShmGroupOptions& options, std::unique_ptr<SharedSegment> segment);

  using Deadline = std::chrono::steady_clock::time_point;

  absl::Status Join(Deadline deadline);
  // Starts the next round: the slots of its parity become the current ones.
  void StartRound();
  std::byte* SlotData(int rank) const;
  // This rank's header for the current round: the operation, its sequence number and
  // arguments, which Sync(check = true) compares with every peer's.
  void WriteHeader(Op op, uint64_t arg, int root);
  // Arrives at the current round's barrier; returns the round.
  uint32_t Arrive();
  // Arrives and waits for every rank (within the timeout), then checks the headers.
  absl::Status Sync(bool check);
  absl::Status Wait(uint32_t round, Deadline deadline);
  absl::Status CheckHeaders();
  // Records the first error of this rank, locally and for the peers, and returns it.
  absl::Status Fail(absl::Status status);
  // Starts an operation: FAILED_PRECONDITION after an earlier error.
  absl::Status Begin(const char* op_name);
  // The error a peer recorded, as this rank returns it.
  absl::Status PeerFailure() const;
  std::string MissingRanks(uint32_t round) const;
  // "group 'x' rank r at operation n (AllGather)", for messages.
  std::string Where() const;

  absl::Status AllReduceDirect(std::span<float> data);
  absl::Status AllReduceScattered(std::span<float> data);

  const std::string name_;
  const int rank_;
  const int world_;
  const size_t slot_bytes_;
  const absl::Duration timeout_;
  absl::Duration spin_;
  std::unique_ptr<SharedSegment> segment_;
  Layout* layout_;        // in segment_
  std::byte* slots_;      // in segment_
  size_t slot_stride_;    // bytes between consecutive slots
  uint32_t round_ = 0;    // the current round; 1 is the join
  uint64_t op_seq_ = 0;   // operations begun, for the headers and messages
  const char* op_name_ = "join";
  bool registered_ = false;  // holds its rank's record (not so after ALREADY_EXISTS)
  absl::Status status_;   // the first error; the group is unusable after one
};

}  // namespace tandem::parallel
