// The KV transfer interface (docs/design.md §5): register local memory, describe it to a peer,
// and let the peer put bytes into it with one-sided writes. No engine, no gRPC: what moves
// and where is decided by the caller (control plane); this layer only moves bytes.
//
// Typical use, prefill side (P) writing one layer into decode replica D's KV pool:
//
//   // D, once: register the pool and publish its descriptor through the control plane.
//   auto region = engine->RegisterMemory(pool, pool_bytes);          // RAII
//   std::string wire = (*region)->descriptor().Serialize();
//
//   // P, per layer: one batch of puts into D's blocks, flushed as soon as it is queued.
//   ASSIGN_OR_RETURN(auto dest, RemoteMemoryDescriptor::Parse(wire));
//   auto batch = engine->NewBatch(dest);
//   for (const Block& b : blocks) RETURN_IF_ERROR(batch->Put(b.src, b.bytes, b.dst_offset));
//   batch->Flush(absl::Seconds(10), [](absl::Status s) { ... });     // layer l in flight
//   ... compute layer l + 1 meanwhile, then its own batch ...
//
// Ownership and lifetimes:
//  - The engine outlives every MemoryRegion and TransferBatch it created.
//  - The bytes a Put names must stay valid and unmodified from Put until the batch's done
//    callback has run. The engine reads them asynchronously, and done runs only when the
//    transport no longer touches them, on success, error and timeout alike.
//  - Destroying a TransferBatch after Flush does not cancel it: it runs to completion and
//    done still runs. Destroying one before Flush discards its puts.
//  - A MemoryRegion must stay registered while peers may write into it; the transport
//    cannot always detect a write into memory that was deregistered (UCX over tcp writes
//    by address). Leases on blocks are the caller's business. A failed batch may have
//    written any subset of its puts. Destroying the engine first stops every write into
//    its regions (regions may outlive their engine).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/transfer/remote_memory_descriptor.h"

namespace tandem::transfer {

// Runs exactly once per flushed batch, on the engine's completion thread (never inside
// Flush; the one exception: CANCELLED for a batch flushed while the engine is being
// destroyed). It must not block; it may start new batches.
using TransferCallback = absl::AnyInvocable<void(absl::Status)>;

// Plain counters since the engine was created (metrics are built on top of them).
struct TransferStats {
  uint64_t bytes_put = 0;          // bytes of puts in batches that completed OK
  uint64_t puts = 0;               // puts (contiguous ones merged) in batches that completed OK
  uint64_t batches_ok = 0;
  uint64_t batches_failed = 0;     // any error: validation, peer failure, timeout
  uint64_t endpoints_created = 0;  // connections to peers (UCX endpoints)
  uint64_t endpoint_failures = 0;  // endpoints dropped after a peer error or a timeout
};

// Registered local memory. Deregistered on destruction.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* base() const { return base_; }
  size_t length() const { return length_; }
  // What a peer needs to put into this region (serialize it for the wire).
  const RemoteMemoryDescriptor& descriptor() const { return descriptor_; }

 protected:
  MemoryRegion(void* base, size_t length, RemoteMemoryDescriptor descriptor)
      : base_(base), length_(length), descriptor_(std::move(descriptor)) {}

 private:
  void* base_;
  size_t length_;
  RemoteMemoryDescriptor descriptor_;
};

// One put: `length` bytes from `local` to destination base + `remote_offset`.
struct PutOp {
  const void* local = nullptr;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

class TransferEngine;

// A list of puts into one destination region, completed as a whole: done reports OK only
// when every put is remotely complete (written into the peer's memory). Puts are handed to
// the transport at Flush. A batch is used by one thread at a time; different batches of
// one engine may be used from different threads concurrently, and any number of flushed
// batches may be in flight at once (one layer's puts while the next layer computes).
class TransferBatch {
 public:
  ~TransferBatch();
  TransferBatch(const TransferBatch&) = delete;
  TransferBatch& operator=(const TransferBatch&) = delete;

  // Queues a put of [local, local + length) to destination().base + remote_offset.
  // INVALID_ARGUMENT when the range does not fit in destination() (nothing is queued, so
  // nothing is ever written out of bounds) or local is null with length > 0;
  // FAILED_PRECONDITION after Flush. A zero-length put is a no-op. A put that continues
  // the previous one on both sides (next local byte, next remote byte) extends it.
  absl::Status Put(const void* local, size_t length, uint64_t remote_offset);

  // Hands the puts to the transport; `done` runs once all of them are remotely complete or
  // the batch failed. Errors: DEADLINE_EXCEEDED when `timeout` (from now) passes first;
  // UNAVAILABLE when the peer is unreachable, died or its endpoint failed (also for other
  // batches in flight to a peer whose endpoint was dropped); INVALID_ARGUMENT when the
  // destination belongs to another transport; FAILED_PRECONDITION when flushed twice;
  // CANCELLED when the engine is destroyed first. An empty batch completes OK.
  void Flush(absl::Duration timeout, TransferCallback done);

  // Flush and block until done. Must not be called on the engine's completion thread.
  absl::Status Wait(absl::Duration timeout);

  // No put of this batch starts after `deadline` (steady clock): the transport's own thread
  // checks it right before each put or copy, so a batch that reaches the wire late, or a
  // writer held up between two puts, fails with DEADLINE_EXCEEDED instead of writing (the
  // puts before may have landed). For writes into memory leased to the writer (a KV
  // reservation): the deadline ends before the lease does. Unset: no such limit.
  void set_write_deadline(std::chrono::steady_clock::time_point deadline) { write_deadline_ = deadline; }

  const RemoteMemoryDescriptor& destination() const { return destination_; }
  size_t num_puts() const { return puts_.size(); }  // after merging contiguous puts
  uint64_t bytes() const { return bytes_; }

 private:
  friend class TransferEngine;
  TransferBatch(TransferEngine* engine, RemoteMemoryDescriptor destination);

  TransferEngine* engine_;
  RemoteMemoryDescriptor destination_;
  std::vector<PutOp> puts_;
  uint64_t bytes_ = 0;
  bool flushed_ = false;
  std::chrono::steady_clock::time_point write_deadline_ = std::chrono::steady_clock::time_point::max();
};

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // "ucx" or "inproc": the RemoteMemoryDescriptor::transport this engine produces and reaches.
  virtual std::string_view transport() const = 0;
  // What a peer needs to connect to this engine (opaque bytes; also in every descriptor).
  virtual std::string address() const = 0;

  // Registers [base, base + length) so that peers can put into it. INVALID_ARGUMENT for a
  // null or empty range; transport errors otherwise. Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* base,
                                                                       size_t length) = 0;

  // Allocates `length` bytes (zeroed, page-aligned) that peers can put into; freed and
  // deregistered on destruction. Prefer it to RegisterMemory for destinations (a KV pool,
  // a staging buffer): UCX backs it with shared memory, which peers on the same host write
  // directly (see ucx_transfer_engine.h). Thread-safe.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(size_t length) = 0;

  // Starts an empty batch of puts into `destination`. Thread-safe.
  std::unique_ptr<TransferBatch> NewBatch(RemoteMemoryDescriptor destination);

  TransferStats stats() const;

 protected:
  TransferEngine() = default;

  // A flushed batch handed to the implementation. `error`, when not OK, is the outcome
  // already decided by validation: the implementation completes the batch with it without
  // touching the transport (still on its completion thread).
  struct Submission {
    RemoteMemoryDescriptor destination;
    std::vector<PutOp> puts;
    uint64_t bytes = 0;
    absl::Time deadline;
    // TransferBatch::set_write_deadline: checked before each put (PutAllowed).
    std::chrono::steady_clock::time_point write_deadline = std::chrono::steady_clock::time_point::max();
    absl::Status error;
    TransferCallback done;
  };
  // Takes ownership of the submission and must eventually run `done` exactly once, on the
  // completion thread, after the transport stopped reading the local buffers.
  virtual void Submit(Submission submission) = 0;
  // True on the thread that runs done callbacks (Wait there would deadlock).
  virtual bool OnCompletionThread() const = 0;
  // Implementations call it right before starting each put of `s` (the last point before
  // bytes move): the error to fail the batch with when the write deadline has passed.
  static absl::Status PutAllowed(const Submission& s);

  // Counters for stats(); implementations update them.
  void CountBatch(const Submission& s, const absl::Status& status);
  void CountEndpointCreated() { endpoints_created_.fetch_add(1, std::memory_order_relaxed); }
  void CountEndpointFailure() { endpoint_failures_.fetch_add(1, std::memory_order_relaxed); }

 private:
  friend class TransferBatch;

  std::atomic<uint64_t> bytes_put_{0};
  std::atomic<uint64_t> puts_{0};
  std::atomic<uint64_t> batches_ok_{0};
  std::atomic<uint64_t> batches_failed_{0};
  std::atomic<uint64_t> endpoints_created_{0};
  std::atomic<uint64_t> endpoint_failures_{0};
};

}  // namespace tandem::transfer
