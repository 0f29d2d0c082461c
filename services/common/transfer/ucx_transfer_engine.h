// UcxTransferEngine: the TransferEngine over UCX ucp RMA (one-sided puts).
//
// Connections: a peer is reached by its ucp worker address (ucp_ep_create with
// UCP_EP_PARAM_FIELD_REMOTE_ADDRESS; no listener, no extra port). The address travels in
// every RemoteMemoryDescriptor. Endpoints are created on first use, cached per peer
// address, and dropped when the peer fails (error callback) or a batch to it times out, so
// the next batch reconnects. Memory is registered with ucp_mem_map and described with
// ucp_rkey_pack; rkeys are unpacked once per (endpoint, packed rkey) and cached.
//
// Threads: ONE progress thread per engine owns the ucp_worker (UCS_THREAD_MODE_SINGLE)
// and every call into UCX (endpoints, puts, flushes, rkeys, mem_map). Callers hand work
// over through a mutex-protected queue and an eventfd: one hand-off per flushed batch (a
// batch's puts travel as one vector), not per put, so the lock is cheap next to the data
// it moves, and the UCX fast path runs without UCX's own locks (THREAD_MODE_MULTI would
// lock the worker on every call and make the callers' threads contend with progress).
// While batches are in flight the thread busy-polls ucp_worker_progress (full bandwidth,
// lowest latency); when idle it spins briefly, then arms the worker and sleeps in
// epoll_wait on the worker's event fd and the eventfd. Done callbacks run on this thread,
// outside ucp_worker_progress.
//
// Completion: a batch posts its puts (ucp_put_nbx) and then ucp_ep_flush_nbx; it is done
// when the flush and every put request completed, i.e. the data is written remotely.
// Failures are never silent: a put or flush error, the peer's death (error callback with
// UCP_ERR_HANDLING_MODE_PEER) or the deadline fail the batch; on a deadline the endpoint
// is closed with UCP_EP_CLOSE_FLAG_FORCE, which completes every outstanding request (with
// an error) before done runs, so the caller may free its buffers when done runs.
//
// Transports come from the usual UCX environment (UCX_TLS, UCX_NET_DEVICES, ...) or from
// Options::ucx_config. Measured here with Debian's UCX 1.13.1 (2 cores, loopback):
//  - UCX_TLS=tcp (UCX_NET_DEVICES=lo): connect by worker address works. tcp has no RMA
//    lane (no memory keys), so UCX emulates puts with active messages that the target's
//    worker applies: the destination engine's progress thread must run (it does).
//  - UCX_TLS=sm,self (or posix,cma,self): works between processes of one host, no tcp
//    needed when connecting by worker address (unlike a sockaddr listener). Large puts go
//    zero-copy through cma (process_vm_writev).
//  - UCX_TLS=sm,tcp (or sm,self,tcp): works; shared memory is chosen for the data.
// See bench/README.md for the bandwidth figures against ucx_perftest.
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
    // e.g. {{"TLS", "tcp"}, {"NET_DEVICES", "lo"}}.
    std::vector<std::pair<std::string, std::string>> ucx_config;
    // How long the idle progress thread keeps polling before it sleeps on the event fd.
    absl::Duration idle_spin = absl::Microseconds(200);
    // Endpoints are created with UCP_ERR_HANDLING_MODE_PEER (a dead peer fails its batches
    // at once). When no transport can honour it (shared memory only, see above), connect
    // without it unless this is set; batch deadlines then bound failures.
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
  // False once an endpoint had to be created without peer failure detection.
  bool peer_failure_detection() const;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* base,
                                                               size_t length) override;

 protected:
  void Submit(Submission submission) override;
  bool OnCompletionThread() const override;

 private:
  class Worker;  // the progress thread and everything UCX (ucx_transfer_engine.cc)
  class Region;
  explicit UcxTransferEngine(std::shared_ptr<Worker> worker);

  std::shared_ptr<Worker> worker_;
};

}  // namespace tandem::transfer
