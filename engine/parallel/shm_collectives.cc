#include "engine/parallel/shm_collectives.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common/check.h"

namespace tandem::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// The words that processes share must be lock-free atomics (a lock inside a process's
// std::atomic would not be shared), and the futex word exactly 32 bits.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

// "TND1": the layout below, version 1. Rank 0 stores it last, once the header is written.
constexpr uint32_t kReady = 0x31444e54;
constexpr size_t kMinSlotBytes = 4096;
constexpr size_t kSlotHeaderBytes = 64;
// Liveness, failure and deadline checks happen at least this often while a rank waits.
constexpr std::chrono::milliseconds kCheckInterval{10};
// Up to this size an all-reduce has every rank sum whole chunks (one round per chunk);
// above it, with more than two ranks, reduce-scatter then gather (two rounds, W times
// less reading). Both add in rank order, so the choice never changes a bit.
constexpr size_t kDirectReduceBytes = 16 * 1024;

struct alignas(64) RankRecord {
  std::atomic<uint32_t> claimed;     // 0 -> 1 by the process that takes the rank
  std::atomic<int32_t> pid;          // stored after start_time; 0: not registered yet
  std::atomic<uint64_t> start_time;  // ProcessIdentity::start_time
  std::atomic<uint32_t> round;       // the last round this rank arrived at
  std::atomic<uint32_t> left;        // 1 once it closed the group
};

// Written by each rank into its slot every round (plain memory: the barrier's counter
// orders it), compared across ranks on an operation's first round.
struct SlotHeader {
  uint32_t op;
  int32_t root;
  uint64_t seq;
  uint64_t arg;
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes);

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the word lives in a mapping shared by processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  // EAGAIN (the word changed), ETIMEDOUT and EINTR all send the caller back to its checks.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t CeilDiv(size_t n, size_t d) { return (n + d - 1) / d; }

}  // namespace

enum class ShmCollectives::Op : uint32_t {
  kBarrier = 1,
  kBroadcast = 2,
  kAllGather = 3,
  kAllReduceSum = 4,
  kAllToAll = 5,
};

struct ShmCollectives::Layout {
  std::atomic<uint32_t> state;  // kReady once rank 0 has written the rest
  uint32_t world;
  uint64_t slot_bytes;
  // The barrier: every rank adds 1 per round, so round k is complete at k * world
  // (modulo 2^32). Also the futex word the waiters sleep on.
  alignas(64) std::atomic<uint32_t> arrivals;
  alignas(64) std::atomic<uint32_t> sleepers;
  // The first error of any rank: 0 none, 1 being written, 2 written.
  alignas(64) std::atomic<uint32_t> failure_state;
  int32_t failure_rank;
  uint32_t failure_code;
  char failure_message[512];
  RankRecord ranks[kShmMaxWorld];
};

namespace {

size_t SlotsOffset() { return RoundUp(sizeof(ShmCollectives::Layout), 4096); }

size_t SegmentBytes(int world, size_t slot_bytes) {
  return SlotsOffset() + 2 * static_cast<size_t>(world) * (kSlotHeaderBytes + slot_bytes);
}

absl::Status ValidateOptions(const ShmGroupOptions& o) {
  if (o.world_size < 1 || o.world_size > kShmMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", o.world_size, " is not in [1, ", kShmMaxWorld, "]"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in [0, ", o.world_size, ")"));
  }
  if (o.slot_bytes < kMinSlotBytes || o.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot_bytes ", o.slot_bytes, " is not a multiple of 64 of at least ", kMinSlotBytes));
  }
  if (o.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be positive");
  if (o.spin.has_value() && *o.spin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("spin must not be negative");
  }
  return ValidateSegmentName({o.name, o.directory});
}

Clock::time_point DeadlineAfter(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return Clock::time_point::max();
  return Clock::now() + absl::ToChronoNanoseconds(d);
}

}  // namespace

ShmCollectives::ShmCollectives(const ShmGroupOptions& options,
                               std::unique_ptr<SharedSegment> segment)
    : name_(options.name),
      rank_(options.rank),
      world_(options.world_size),
      slot_bytes_(options.slot_bytes),
      timeout_(options.timeout),
      segment_(std::move(segment)),
      layout_(reinterpret_cast<Layout*>(segment_->data())),
      slots_(segment_->data() + SlotsOffset()),
      slot_stride_(kSlotHeaderBytes + options.slot_bytes) {
  spin_ = options.spin.value_or(world_ <= UsableCpus() ? absl::Microseconds(20)
                                                       : absl::ZeroDuration());
}

absl::StatusOr<std::unique_ptr<ShmCollectives>> ShmCollectives::Open(const ShmGroupOptions& o) {
  if (absl::Status s = ValidateOptions(o); !s.ok()) return s;
  const SegmentName name{o.name, o.directory};
  const size_t bytes = SegmentBytes(o.world_size, o.slot_bytes);
  const Clock::time_point deadline = DeadlineAfter(o.timeout);
  if (o.rank == 0) {
    absl::StatusOr<std::unique_ptr<SharedSegment>> seg = SharedSegment::Create(name, bytes);
    if (!seg.ok()) return seg.status();
    // The file is zero bytes, a valid representation of every lock-free atomic; the
    // placement new makes the header an object of this process too.
    Layout* layout = new ((*seg)->data()) Layout();
    layout->world = static_cast<uint32_t>(o.world_size);
    layout->slot_bytes = o.slot_bytes;
    const ProcessIdentity self = SelfIdentity();
    layout->ranks[0].claimed.store(1, std::memory_order_relaxed);
    layout->ranks[0].start_time.store(self.start_time, std::memory_order_relaxed);
    layout->ranks[0].pid.store(self.pid, std::memory_order_relaxed);
    layout->state.store(kReady, std::memory_order_release);
    std::unique_ptr<ShmCollectives> group(new ShmCollectives(o, *std::move(seg)));
    if (absl::Status s = group->Join(deadline); !s.ok()) return s;  // ~ShmCollectives unlinks
    // Every rank has it mapped: from now on a crash leaves nothing behind in the name space.
    group->segment_->UnlinkIfOurs();
    return group;
  }
  for (;;) {
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", o.rank, ": rank 0 did not create group '", o.name, "' (",
                       SegmentPath(name), ") within ", absl::FormatDuration(o.timeout)));
    }
    absl::StatusOr<std::unique_ptr<SharedSegment>> seg = SharedSegment::Open(name);
    if (!seg.ok() && !absl::IsNotFound(seg.status())) return seg.status();
    if (seg.ok() && (*seg)->size() >= sizeof(Layout)) {
      const Layout* layout = reinterpret_cast<const Layout*>((*seg)->data());
      // Not ready: rank 0 is writing it (or died doing so). Rank 0 dead: a crashed run's
      // leftover, which the new rank 0 will replace.
      const bool ready = layout->state.load(std::memory_order_acquire) == kReady;
      const ProcessIdentity creator{layout->ranks[0].pid.load(std::memory_order_relaxed),
                                    layout->ranks[0].start_time.load(std::memory_order_relaxed)};
      if (ready && creator.pid > 0 && ProcessAlive(creator)) {
        if (layout->world != static_cast<uint32_t>(o.world_size) || layout->slot_bytes != o.slot_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", o.rank, ": group '", o.name, "' was created with world size ", layout->world,
              " and slot_bytes ", layout->slot_bytes, ", this rank was given ", o.world_size,
              " and ", o.slot_bytes));
        }
        if ((*seg)->size() != bytes) {
          return absl::InternalError(absl::StrCat("group '", o.name, "' segment has ",
                                                  (*seg)->size(), " bytes, expected ", bytes));
        }
        std::unique_ptr<ShmCollectives> group(new ShmCollectives(o, *std::move(seg)));
        if (absl::Status s = group->Join(deadline); !s.ok()) return s;
        return group;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

absl::Status ShmCollectives::Join(Clock::time_point deadline) {
  RankRecord& me = layout_->ranks[rank_];
  if (rank_ != 0) {
    uint32_t unclaimed = 0;
    if (!me.claimed.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
      const ProcessIdentity holder{me.pid.load(std::memory_order_acquire),
                                   me.start_time.load(std::memory_order_relaxed)};
      // Not this process's group to fail: the error is this process's alone.
      if (holder.pid > 0 && ProcessAlive(holder)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "group '", name_, "': rank ", rank_, " is held by live pid ", holder.pid));
      }
      return absl::UnavailableError(absl::StrCat(
          "group '", name_, "': rank ", rank_, " was taken by a process that is gone"));
    }
    const ProcessIdentity self = SelfIdentity();
    me.start_time.store(self.start_time, std::memory_order_relaxed);
    me.pid.store(self.pid, std::memory_order_release);
  }
  registered_ = true;
  round_ = 1;
  return Wait(Arrive(), deadline);
}

ShmCollectives::~ShmCollectives() {
  // Peers that still wait for this rank see it gone at their next check.
  if (registered_) layout_->ranks[rank_].left.store(1, std::memory_order_release);
  if (rank_ == 0) segment_->UnlinkIfOurs();
}

void ShmCollectives::StartRound() { ++round_; }

std::byte* ShmCollectives::SlotData(int rank) const {
  const size_t index = 2 * static_cast<size_t>(rank) + (round_ & 1);
  return slots_ + index * slot_stride_ + kSlotHeaderBytes;
}

void ShmCollectives::WriteHeader(Op op, uint64_t arg, int root) {
  SlotHeader h{static_cast<uint32_t>(op), root, op_seq_, arg};
  std::memcpy(SlotData(rank_) - kSlotHeaderBytes, &h, sizeof(h));
}

uint32_t ShmCollectives::Arrive() {
  layout_->ranks[rank_].round.store(round_, std::memory_order_relaxed);
  // seq_cst, with the sleepers' increment and load below and in Wait: either the last
  // arriver sees a sleeper and wakes it, or the sleeper sees the final count (and the
  // futex, comparing the word, does not sleep on a stale value either).
  const uint32_t before = layout_->arrivals.fetch_add(1, std::memory_order_seq_cst);
  if (before + 1 == round_ * static_cast<uint32_t>(world_) &&
      layout_->sleepers.load(std::memory_order_seq_cst) > 0) {
    FutexWakeAll(&layout_->arrivals);
  }
  return round_;
}

absl::Status ShmCollectives::Sync(bool check) {
  if (absl::Status s = Wait(Arrive(), DeadlineAfter(timeout_)); !s.ok()) return s;
  if (check) {
    if (absl::Status s = CheckHeaders(); !s.ok()) return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::Wait(uint32_t round, Clock::time_point deadline) {
  const uint32_t target = round * static_cast<uint32_t>(world_);
  // Modular: the count wraps after 2^32 arrivals, and no rank is a round ahead of it.
  const auto reached = [target](uint32_t count) {
    return static_cast<int32_t>(count - target) >= 0;
  };
  std::atomic<uint32_t>& arrivals = layout_->arrivals;
  if (spin_ > absl::ZeroDuration()) {
    const Clock::time_point spin_end = Clock::now() + absl::ToChronoNanoseconds(spin_);
    for (uint32_t i = 1;; ++i) {
      if (reached(arrivals.load(std::memory_order_acquire))) return absl::OkStatus();
      CpuRelax();
      if (i % 64 == 0 && Clock::now() >= spin_end) break;
    }
  }
  Clock::time_point next_check = Clock::now() + kCheckInterval;
  for (;;) {
    if (reached(arrivals.load(std::memory_order_acquire))) return absl::OkStatus();
    if (layout_->failure_state.load(std::memory_order_acquire) == 2) return Fail(PeerFailure());
    const Clock::time_point now = Clock::now();
    if (now >= next_check || now >= deadline) {
      // A dead peer is the better answer than a timeout when both hold.
      for (int p = 0; p < world_; ++p) {
        const RankRecord& r = layout_->ranks[p];
        if (r.round.load(std::memory_order_relaxed) == round) continue;  // arrived
        const ProcessIdentity peer{r.pid.load(std::memory_order_acquire),
                                   r.start_time.load(std::memory_order_relaxed)};
        if (peer.pid == 0) continue;  // not joined yet: only the deadline applies
        if (r.left.load(std::memory_order_acquire) != 0) {
          return Fail(absl::UnavailableError(absl::StrCat(Where(), ": rank ", p, " left the group")));
        }
        if (!ProcessAlive(peer)) {
          return Fail(absl::UnavailableError(
              absl::StrCat(Where(), ": rank ", p, " (pid ", peer.pid, ") died")));
        }
      }
      next_check = now + kCheckInterval;
    }
    if (now >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          Where(), ": rank(s) ", MissingRanks(round), " did not arrive within ",
          absl::FormatDuration(timeout_))));
    }
    layout_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t count = arrivals.load(std::memory_order_seq_cst);
    if (!reached(count) && layout_->failure_state.load(std::memory_order_acquire) != 2) {
      FutexWait(&arrivals, count, std::min(next_check, deadline) - now);
    }
    layout_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

std::string ShmCollectives::MissingRanks(uint32_t round) const {
  std::vector<int> missing;
  for (int p = 0; p < world_; ++p) {
    if (layout_->ranks[p].round.load(std::memory_order_relaxed) != round) missing.push_back(p);
  }
  return absl::StrJoin(missing, ", ");
}

std::string ShmCollectives::Where() const {
  return absl::StrCat("group '", name_, "' rank ", rank_, " at operation ", op_seq_, " (",
                      op_name_, ")");
}

absl::Status ShmCollectives::CheckHeaders() {
  SlotHeader mine;
  std::memcpy(&mine, SlotData(rank_) - kSlotHeaderBytes, sizeof(mine));
  for (int p = 0; p < world_; ++p) {
    SlotHeader theirs;
    std::memcpy(&theirs, SlotData(p) - kSlotHeaderBytes, sizeof(theirs));
    if (theirs.op != mine.op || theirs.seq != mine.seq || theirs.arg != mine.arg ||
        theirs.root != mine.root) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), ": ranks disagree: this rank called op ", mine.op, " (argument ", mine.arg,
          ", root ", mine.root, ") as operation ", mine.seq, ", rank ", p, " op ", theirs.op,
          " (argument ", theirs.arg, ", root ", theirs.root, ") as operation ", theirs.seq));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::Fail(absl::Status status) {
  TANDEM_CHECK(!status.ok());
  if (status_.ok()) status_ = status;
  uint32_t none = 0;
  if (layout_->failure_state.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
    layout_->failure_rank = rank_;
    layout_->failure_code = static_cast<uint32_t>(status.code());
    const absl::string_view msg = status.message();
    const size_t n = std::min(msg.size(), sizeof(layout_->failure_message) - 1);
    std::memcpy(layout_->failure_message, msg.data(), n);
    layout_->failure_message[n] = '\0';
    layout_->failure_state.store(2, std::memory_order_release);
    FutexWakeAll(&layout_->arrivals);
  }
  return status;
}

absl::Status ShmCollectives::PeerFailure() const {
  return absl::Status(static_cast<absl::StatusCode>(layout_->failure_code),
                      absl::StrCat(Where(), ": rank ", layout_->failure_rank,
                                   " failed: ", layout_->failure_message));
}

absl::Status ShmCollectives::Begin(const char* op_name) {
  if (!status_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group '", name_, "' rank ", rank_, " is unusable after an earlier error: ",
        status_.ToString()));
  }
  ++op_seq_;
  op_name_ = op_name;
  if (layout_->failure_state.load(std::memory_order_acquire) == 2) return Fail(PeerFailure());
  return absl::OkStatus();
}

absl::Status ShmCollectives::Barrier() {
  if (absl::Status s = Begin("Barrier"); !s.ok()) return s;
  StartRound();
  WriteHeader(Op::kBarrier, 0, 0);
  return Sync(/*check=*/true);
}

absl::Status ShmCollectives::Broadcast(std::span<std::byte> data, int root) {
  if (absl::Status s = Begin("Broadcast"); !s.ok()) return s;
  if (root < 0 || root >= world_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(), ": root ", root, " is not in [0, ", world_, ")")));
  }
  const size_t n = data.size();
  const size_t rounds = std::max<size_t>(1, CeilDiv(n, slot_bytes_));
  for (size_t k = 0; k < rounds; ++k) {
    StartRound();
    WriteHeader(Op::kBroadcast, n, root);
    const size_t off = k * slot_bytes_;
    const size_t len = std::min(slot_bytes_, n - off);
    if (rank_ == root && len > 0) std::memcpy(SlotData(rank_), data.data() + off, len);
    if (absl::Status s = Sync(/*check=*/k == 0); !s.ok()) return s;
    if (rank_ != root && len > 0) std::memcpy(data.data() + off, SlotData(root), len);
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllGather(std::span<const std::byte> send, std::span<std::byte> recv) {
  if (absl::Status s = Begin("AllGather"); !s.ok()) return s;
  const size_t b = send.size();
  if (recv.size() != b * world_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(), ": recv has ", recv.size(), " bytes, not ", world_, " x ", b)));
  }
  std::byte* own = recv.data() + rank_ * b;
  if (b > 0 && send.data() != own) std::memmove(own, send.data(), b);
  const size_t rounds = std::max<size_t>(1, CeilDiv(b, slot_bytes_));
  for (size_t k = 0; k < rounds; ++k) {
    StartRound();
    WriteHeader(Op::kAllGather, b, 0);
    const size_t off = k * slot_bytes_;
    const size_t len = std::min(slot_bytes_, b - off);
    if (len > 0) std::memcpy(SlotData(rank_), own + off, len);
    if (absl::Status s = Sync(/*check=*/k == 0); !s.ok()) return s;
    if (len == 0) continue;
    for (int p = 0; p < world_; ++p) {
      if (p != rank_) std::memcpy(recv.data() + p * b + off, SlotData(p), len);
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllReduceSum(std::span<float> data) {
  if (absl::Status s = Begin("AllReduceSum"); !s.ok()) return s;
  if (world_ <= 2 || data.size_bytes() <= kDirectReduceBytes) return AllReduceDirect(data);
  return AllReduceScattered(data);
}

namespace {

// out[i] = a[i] + b[i]; `out` may be `a`. Eight lanes at a time through GCC's vector
// extension: -O2 leaves a plain loop of unknown length scalar, and a lane adds exactly as
// the scalar code would (no reassociation, nothing to contract into an FMA), so the bits
// do not change.
void Add(float* out, const float* a, const float* b, size_t n) {
  using Lanes = float __attribute__((vector_size(32)));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Lanes x, y;
    std::memcpy(&x, a + i, sizeof(x));
    std::memcpy(&y, b + i, sizeof(y));
    x += y;
    std::memcpy(out + i, &x, sizeof(x));
  }
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

// out = (x_0 + x_1) + x_2 + ...: the rank-order sum, element by element, of
// parts[p][begin, begin + count).
void SumInRankOrder(float* out, const std::vector<const float*>& parts, size_t begin,
                    size_t count) {
  if (parts.size() == 1) {
    std::memcpy(out, parts[0] + begin, count * sizeof(float));
    return;
  }
  Add(out, parts[0] + begin, parts[1] + begin, count);
  for (size_t p = 2; p < parts.size(); ++p) Add(out, out, parts[p] + begin, count);
}

}  // namespace

absl::Status ShmCollectives::AllReduceDirect(std::span<float> data) {
  const size_t n = data.size();
  const size_t piece = slot_bytes_ / sizeof(float);
  const size_t rounds = std::max<size_t>(1, CeilDiv(n, piece));
  std::vector<const float*> parts(world_);
  for (size_t k = 0; k < rounds; ++k) {
    StartRound();
    WriteHeader(Op::kAllReduceSum, n, 0);
    const size_t off = k * piece;
    const size_t m = std::min(piece, n - off);
    if (m > 0) std::memcpy(SlotData(rank_), data.data() + off, m * sizeof(float));
    if (absl::Status s = Sync(/*check=*/k == 0); !s.ok()) return s;
    if (m == 0) continue;
    for (int p = 0; p < world_; ++p) parts[p] = reinterpret_cast<const float*>(SlotData(p));
    SumInRankOrder(data.data() + off, parts, 0, m);
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllReduceScattered(std::span<float> data) {
  const size_t n = data.size();
  const size_t piece = slot_bytes_ / sizeof(float);
  const size_t w = static_cast<size_t>(world_);
  std::vector<const float*> parts(world_);
  for (size_t k = 0; k * piece < n; ++k) {
    const size_t off = k * piece;
    const size_t m = std::min(piece, n - off);
    const auto share_begin = [m, w](size_t p) { return m * p / w; };
    // Round A: every rank's piece.
    StartRound();
    WriteHeader(Op::kAllReduceSum, n, 0);
    std::memcpy(SlotData(rank_), data.data() + off, m * sizeof(float));
    if (absl::Status s = Sync(/*check=*/k == 0); !s.ok()) return s;
    for (int p = 0; p < world_; ++p) parts[p] = reinterpret_cast<const float*>(SlotData(p));
    // Round B: this rank's share of the piece, summed in rank order into its other slot
    // (free: every rank finished reading it before arriving at round A).
    StartRound();
    WriteHeader(Op::kAllReduceSum, n, 0);
    const size_t lo = share_begin(rank_);
    SumInRankOrder(reinterpret_cast<float*>(SlotData(rank_)), parts, lo,
                   share_begin(rank_ + 1) - lo);
    if (absl::Status s = Sync(/*check=*/false); !s.ok()) return s;
    for (int p = 0; p < world_; ++p) {
      const size_t begin = share_begin(p);
      const size_t count = share_begin(p + 1) - begin;
      if (count > 0) std::memcpy(data.data() + off + begin, SlotData(p), count * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCollectives::AllToAll(std::span<const std::span<const std::byte>> send,
                                      std::span<std::byte> recv, std::span<size_t> recv_sizes) {
  if (absl::Status s = Begin("AllToAll"); !s.ok()) return s;
  const size_t w = static_cast<size_t>(world_);
  if (send.size() != w || recv_sizes.size() != w) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        Where(), ": ", send.size(), " send blocks and ", recv_sizes.size(),
        " receive sizes for ", world_, " ranks")));
  }
  // Round 1: the sizes. Each rank publishes its receive capacity and its send sizes, so
  // every rank knows the whole matrix and reaches the same verdicts and round count.
  StartRound();
  WriteHeader(Op::kAllToAll, w, 0);
  {
    uint64_t* row = reinterpret_cast<uint64_t*>(SlotData(rank_));
    row[0] = recv.size();
    for (size_t d = 0; d < w; ++d) row[1 + d] = send[d].size();
  }
  if (absl::Status s = Sync(/*check=*/true); !s.ok()) return s;
  std::vector<uint64_t> size(w * w);  // size[s * w + d]: bytes from s to d
  std::vector<uint64_t> capacity(w);
  for (size_t s = 0; s < w; ++s) {
    const uint64_t* row = reinterpret_cast<const uint64_t*>(SlotData(static_cast<int>(s)));
    capacity[s] = row[0];
    std::copy(row + 1, row + 1 + w, size.begin() + s * w);
  }
  for (size_t s = 0; s < w; ++s) recv_sizes[s] = size[s * w + rank_];
  for (size_t d = 0; d < w; ++d) {
    uint64_t total = 0;
    for (size_t s = 0; s < w; ++s) total += size[s * w + d];
    if (total > capacity[d]) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Where(), ": rank ", d, " would receive ", total, " bytes into ", capacity[d]));
    }
  }
  // Each source's blocks for the other ranks, concatenated in destination order, form its
  // stream; round k carries bytes [k S, (k + 1) S) of every stream.
  std::vector<uint64_t> stream_off(w * w, 0);  // where s's block for d starts in s's stream
  uint64_t longest = 0;
  for (size_t s = 0; s < w; ++s) {
    uint64_t at = 0;
    for (size_t d = 0; d < w; ++d) {
      if (d == s) continue;
      stream_off[s * w + d] = at;
      at += size[s * w + d];
    }
    longest = std::max(longest, at);
  }
  std::vector<uint64_t> recv_off(w, 0);
  for (size_t s = 1; s < w; ++s) recv_off[s] = recv_off[s - 1] + recv_sizes[s - 1];
  const size_t me = static_cast<size_t>(rank_);
  if (recv_sizes[me] > 0) std::memcpy(recv.data() + recv_off[me], send[me].data(), recv_sizes[me]);
  // Copies the part of block [block, block + len) of a stream that lies in window
  // [lo, lo + slot_bytes_): `copy(offset in block, offset in window, bytes)`.
  const auto overlap = [this](uint64_t block, uint64_t len, uint64_t lo, auto&& copy) {
    const uint64_t begin = std::max(block, lo);
    const uint64_t end = std::min(block + len, lo + slot_bytes_);
    if (begin < end) copy(begin - block, begin - lo, end - begin);
  };
  const size_t rounds = CeilDiv(longest, slot_bytes_);
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t lo = k * slot_bytes_;
    StartRound();
    WriteHeader(Op::kAllToAll, w, 0);
    std::byte* mine = SlotData(rank_);
    for (size_t d = 0; d < w; ++d) {
      if (d == me) continue;
      overlap(stream_off[me * w + d], size[me * w + d], lo, [&](uint64_t in, uint64_t at, uint64_t n) {
        std::memcpy(mine + at, send[d].data() + in, n);
      });
    }
    if (absl::Status s = Sync(/*check=*/false); !s.ok()) return s;
    for (size_t s = 0; s < w; ++s) {
      if (s == me) continue;
      const std::byte* theirs = SlotData(static_cast<int>(s));
      overlap(stream_off[s * w + me], size[s * w + me], lo, [&](uint64_t in, uint64_t at, uint64_t n) {
        std::memcpy(recv.data() + recv_off[s] + in, theirs + at, n);
      });
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::parallel
