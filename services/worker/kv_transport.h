// What the prefill and decode services need from the KV transfer layer, kept this small
// so the services are tested over an in-process transport and run over UCX:
//  - the decode side exposes its KV pool (a serialized memory descriptor, registered once
//    at startup);
//  - the prefill side opens a write session to a peer's pool, puts byte ranges at pool
//    offsets, and flushes (completion once every byte is remotely visible).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class KvWriteSession {
 public:
  virtual ~KvWriteSession() = default;
  // Queues a write of `length` bytes at `local` (which must stay valid until Flush
  // completes) to byte `pool_offset` of the destination pool. Errors: INVALID_ARGUMENT
  // for a range outside the pool (nothing is written).
  virtual absl::Status Put(const void* local, size_t length, uint64_t pool_offset) = 0;
  // Starts moving what was put so far, without waiting (one layer's writes go while the
  // next layer computes).
  virtual void Commit() = 0;
  // Commits, then calls `done` (on a transport thread) once every write is complete, or
  // with the first failure (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED). Call once.
  virtual void Flush(std::function<void(absl::Status)> done) = 0;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  // Decode side: allocates the KV pool in memory peers can write into (shared memory where
  // the transport offers it), owned by the transport; once per process.
  struct Pool {
    void* base = nullptr;
    size_t bytes = 0;
    std::string descriptor;  // serialized, for KvDestination.memory_descriptor
  };
  virtual absl::StatusOr<Pool> AllocatePool(size_t bytes) = 0;
  // Decode side, instead: registers memory the caller owns as the pool (a rank group's,
  // which its ranks share). Over UCX peers write it over a tcp lane (UCX's shared-memory
  // transports write only memory UCX allocated).
  virtual absl::StatusOr<Pool> RegisterPool(void* /*base*/, size_t /*bytes*/) {
    return absl::UnimplementedError("this transport cannot register memory it did not allocate");
  }
  // Prefill side. No write of the session starts after `write_deadline` (the transport
  // checks it right before each put; later puts fail the session with DEADLINE_EXCEEDED).
  // Errors: INVALID_ARGUMENT (a descriptor that does not parse), UNAVAILABLE.
  virtual absl::StatusOr<std::unique_ptr<KvWriteSession>> OpenSession(
      const std::string& pool_descriptor, std::chrono::steady_clock::time_point write_deadline) = 0;
  virtual std::string name() const = 0;  // "ucx", "in-process"
};

}  // namespace tandem
