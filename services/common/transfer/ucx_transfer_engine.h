// UcxTransferEngine: the TransferEngine over UCX ucp RMA (one-sided puts).
//
// Connections: a peer is reached by its ucp worker address (ucp_ep_create with
// UCP_EP_PARAM_FIELD_REMOTE_ADDRESS; no listener, no extra port). The engine's address()
// wraps that worker address with the owner's identity (pid, start time, boot id, pid
// namespace; ucx_peer_address.h) and travels in every RemoteMemoryDescriptor. Endpoints
// are created on first use, cached per peer address, and dropped when the peer fails or a
// batch to it times out, so the next batch reconnects. Memory is registered with
// ucp_mem_map (AllocateMemory: ucp_mem_map with UCP_MEM_MAP_ALLOCATE) and described with
// ucp_rkey_pack; rkeys are unpacked once per (endpoint, packed rkey) and cached.
//
// Threads: ONE progress thread per engine owns the ucp_worker (UCS_THREAD_MODE_SINGLE)
// and makes every call into UCX (endpoints, puts, flushes, rkeys, mem_map). Callers hand
// work over through a mutex-protected queue and an eventfd: one hand-off per flushed batch
// (its puts travel as one vector), not per put, so the lock is cheap next to the data it
// moves, and the UCX fast path runs without UCX's own locks (UCS_THREAD_MODE_MULTI would
// take the worker lock on every put and make caller threads contend with progress). While
// batches are in flight the thread busy-polls ucp_worker_progress; when idle it spins
// Options::idle_spin, then arms the worker and sleeps in epoll_wait (worker fd, eventfd,
// watched peers). Done callbacks run on this thread, outside ucp_worker_progress.
//
// Completion: a batch posts its puts (ucp_put_nbx) and then ucp_ep_flush_nbx; it is done
// when the flush and every put request completed, i.e. the data is written remotely.
// Destinations this process can map (memory from AllocateMemory on a peer of this host,
// with a shared-memory transport enabled: ucp_rkey_ptr succeeds) are written directly by
// the progress thread instead (streaming stores for large pieces, then a store fence):
// what UCX's own shared-memory put does, with a faster copy (Options::direct_shared_memory).
//
// Failures are never silent: a put or flush error, the peer's death or the deadline fail
// the batch. Peers on this host (same boot and pid namespace, from their address) are
// also watched through a pidfd: a write into the shared memory of a process that died
// completes without it, so the batch reports UNAVAILABLE instead. On a deadline the
// endpoint is closed with UCP_EP_CLOSE_FLAG_FORCE, which completes the outstanding
// requests (with errors) before done runs, so the caller may free its buffers when done
// runs, whatever the outcome.
//
// Transports come from the usual UCX environment (UCX_TLS, UCX_NET_DEVICES, ...) or from
// Options::ucx_config. Measured with Debian's UCX 1.13.1 (2 cores, one host):
//  - UCX_TLS=tcp (UCX_NET_DEVICES=lo): connecting by worker address works. tcp has no RMA
//    lane (its memory domain has no keys), so UCX emulates puts with active messages that
//    the target's worker applies: the destination engine's progress thread does that.
//    Their size is the tcp segment size: Options::tune_tcp raises it (2-3x bandwidth).
//    Peer failure: UCP_ERR_HANDLING_MODE_PEER (connection reset, keepalive). Caveat: data
//    a failed or timed-out batch already handed to the kernel may still land after done
//    reported the failure; a receiver must not reuse a destination range for another
//    sender until that sender is known to be gone (leases longer than its timeouts).
//  - UCX_TLS=sm,self (or posix,sysv,cma,self; no tcp): connecting by worker address works
//    (only connecting through a sockaddr listener needs tcp). But UCX 1.13's posix, sysv
//    and self transports cannot detect a dead peer ("no peer failure handler"), so no
//    endpoint with UCP_ERR_HANDLING_MODE_PEER can be made. The engine then connects with
//    UCP_ERR_HANDLING_MODE_NONE and watches the peer process itself (a pidfd; possible
//    because shared memory implies the same host and pid namespace): a dead peer fails
//    its batches with UNAVAILABLE. Puts are then only allowed into memory the sender can
//    map (AllocateMemory on the peer: UCX shared memory; ucp_rkey_ptr succeeds), which
//    UCX writes directly (no request ever waits on the peer, so none can hang); puts into
//    registered heap memory fail with FAILED_PRECONDITION in this mode.
//  - UCX_TLS=sm,tcp (or sm,self,tcp): connects with UCP_ERR_HANDLING_MODE_PEER; UCX's
//    own lanes are then tcp only (shared-memory lanes cannot serve that mode), but
//    destinations from AllocateMemory are still mapped and written directly, so bytes
//    move through shared memory and puts into registered heap memory go over tcp.
// Recommended: tcp between hosts; sm,tcp (or sm,self) within one. UCX logs to stdout
// unless UCX_LOG_FILE says otherwise. Bandwidth: bench/README.md.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "services/common/transfer/transfer_engine.h"

namespace tandem::transfer {

class UcxTransferEngine final : public TransferEngine {
 public:
  struct Options {
    // Extra UCX settings applied on top of the environment, without the UCX_ prefix,
    // e.g. {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}}. Transport settings go by their name
    // inside the transport ({"TX_SEG_SIZE", "256K"} for UCX_TCP_TX_SEG_SIZE).
    std::vector<std::pair<std::string, std::string>> ucx_config;
    // How long the idle progress thread keeps polling before it sleeps on the event fd.
    absl::Duration idle_spin = absl::Microseconds(200);
    // Larger tcp segments (UCX_TCP_TX_SEG_SIZE=256K, UCX_TCP_RX_SEG_SIZE=1M) unless the
    // environment sets them: 2-3x the put bandwidth of UCX's defaults over tcp.
    bool tune_tcp = true;
    // Write destinations mapped into this process (UCX shared memory, ucp_rkey_ptr) with
    // the progress thread's own copy (streaming stores for large pieces) instead of
    // ucp_put_nbx, which copies with memcpy. Off: every put goes through ucp_put_nbx.
    bool direct_shared_memory = true;
    // Endpoints are created with UCP_ERR_HANDLING_MODE_PEER. When no transport can honour
    // it (shared memory only, see above), the engine connects without it and watches the
    // peer process, unless this is set (then such peers are UNAVAILABLE).
    bool require_peer_failure_detection = false;
  };

  // Creates the UCX context and worker and starts the progress thread. UNAVAILABLE or
  // INTERNAL when UCX cannot start (bad configuration, no usable transport).
  static absl::StatusOr<std::unique_ptr<UcxTransferEngine>> Create(Options options);
  static absl::StatusOr<std::unique_ptr<UcxTransferEngine>> Create() { return Create(Options()); }

  // Batches still in flight complete with CANCELLED before this returns; endpoints are
  // closed. Regions may outlive the engine (they keep the UCX context), unreachable.
  ~UcxTransferEngine() override;

  std::string_view transport() const override { return "ucx"; }
  std::string address() const override;
  // False once an endpoint had to be created without UCX peer failure detection (the
  // peer process is watched instead).
  bool peer_failure_detection() const;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* base,
                                                               size_t length) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(size_t length) override;

 protected:
  void Submit(Submission submission) override;
  bool OnCompletionThread() const override;

 private:
  class Worker;  // the progress thread and everything UCX (ucx_transfer_engine.cc)
  class Region;
  explicit UcxTransferEngine(std::shared_ptr<Worker> worker);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> MapMemory(void* base, size_t length);

  std::shared_ptr<Worker> worker_;
};

}  // namespace tandem::transfer
