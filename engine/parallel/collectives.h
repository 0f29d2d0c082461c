// Collective operations among the ranks of one replica (docs/parallel.md): the one
// interface the data-, expert- and tensor-parallel code speaks, whatever moves the bytes.
//
// Backends:
//   - ShmCollectives (shm_collectives.h): processes of one machine over POSIX shared
//     memory, host buffers. CI runs every partitioning on it; on a GPU replica it is also
//     the host control channel (rank 0's step plan is host data).
//   - An NCCL backend (later, docs/parallel.md step 4) implements the same class over
//     device buffers; see "Device backends" below.
//
// Contract, for every backend:
//   - Every rank of the group calls the same operations, with matching arguments (the
//     same element count, block size, root), in the same order. A backend detects a
//     mismatch where it can cheaply (the shared-memory one always does) and returns
//     INVALID_ARGUMENT on every rank; otherwise the result is undefined.
//   - AllReduceSum sums the ranks' contributions in RANK ORDER, element by element:
//     out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{W-1}[i], starting from x_0[i] (not
//     from 0.0f, which would turn -0.0f into +0.0f). The result is bitwise the same
//     whatever the timing and on every rank, and bitwise equal to a one-rank loop that
//     adds the partitions in that order.
//   - A call returns when this rank's result is complete (host backend) or, for a device
//     backend, when the operation is ordered on the backend's stream (see below). Buffers
//     must not change while a call runs; send and receive buffers must not overlap unless
//     a method says so.
//   - Errors end the call, never a hang: a peer that died (or closed the group) ends it
//     with UNAVAILABLE, a peer that does not arrive within the group's timeout with
//     DEADLINE_EXCEEDED, arguments that are wrong or disagree between ranks with
//     INVALID_ARGUMENT. A rank that fails tells the others, which end their call with the
//     same code promptly instead of waiting out their own timeout. After an error the
//     group is unusable: every later call returns FAILED_PRECONDITION. The one exception
//     is AllToAll's RESOURCE_EXHAUSTED, a verdict every rank reaches together before any
//     data moves, after which the group stays usable.
//   - A group is used by one thread per rank at a time (the rank's engine thread).
//
// Device backends. Buffers are described as spans of bytes (or floats) whose pointers the
// backend never dereferences unless memory() == MemoryKind::kHost: a device backend takes
// device pointers in the same spans. It is created with the rank's compute stream, orders
// each operation on it and returns once it is enqueued (so a decode step can be captured
// in a CUDA graph); errors it finds later (a peer lost, a watchdog timeout) are returned
// by the next call, and the group is unusable after them as here. AllToAll needs the
// sizes on the host before it can post its receives: a device backend exchanges them
// first (a small all-gather and a copy to the host, a sync point that is not graph
// capturable); the low-latency expert dispatch will get its own fixed-capacity entry
// point when it exists. A GPU rank typically holds two groups: a host one (this
// backend) for the step plan and a device one for activations.
#pragma once

#include <cstddef>
#include <span>

#include "absl/status/status.h"

namespace tandem::parallel {

// Where the buffers given to a Collectives must live.
enum class MemoryKind { kHost, kDevice };

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual MemoryKind memory() const = 0;

  // Sums `data` over the ranks, in place, in rank order (see the contract above). `data`
  // has the same number of elements on every rank.
  virtual absl::Status AllReduceSum(std::span<float> data) = 0;

  // Every rank gives `send` (the same size on every rank); `recv` (world_size() times
  // that) receives rank r's block at offset r * send.size(). `send` may be this rank's own
  // block of `recv` (in place).
  virtual absl::Status AllGather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;

  // Personalized exchange with sizes known only to the senders. `send` has world_size()
  // entries, send[d] the bytes for rank d (any size, zero included). The blocks received
  // are packed into `recv` in source rank order: recv_sizes[s] (world_size() entries, set
  // by the call) is the size of the block from rank s, at offset recv_sizes[0] + ... +
  // recv_sizes[s - 1]. The sizes are exchanged inside the call. If any rank's `recv` is
  // too small for what it would receive, every rank returns RESOURCE_EXHAUSTED before
  // any data moves, with recv_sizes set (so the caller can size a retry), and the group
  // stays usable.
  virtual absl::Status AllToAll(std::span<const std::span<const std::byte>> send,
                                std::span<std::byte> recv, std::span<size_t> recv_sizes) = 0;

  // Copies `root`'s `data` into every other rank's `data` (the same size on every rank).
  virtual absl::Status Broadcast(std::span<std::byte> data, int root) = 0;

  // Returns when every rank has called it.
  virtual absl::Status Barrier() = 0;
};

}  // namespace tandem::parallel
