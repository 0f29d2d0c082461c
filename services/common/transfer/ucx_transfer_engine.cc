#include "services/common/transfer/ucx_transfer_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"
#include "services/common/transfer/event.h"
#include "services/common/transfer/ucx_support.h"
#include "services/common/transfer/ucx_peer_address.h"

namespace tandem::transfer {
namespace {

using internal::CopyToMapped;
using internal::ErrnoMessage;
using internal::FromUcs;
using internal::ProcessIdentity;
using internal::StoreFence;
using internal::UcxPeerAddress;

// Whether UCX_TLS (or Options::ucx_config's TLS) lets tcp in.
bool TcpEnabled(const UcxTransferEngine::Options& options) {
  const char* env = std::getenv("UCX_TLS");
  std::string tls = env == nullptr ? "" : env;
  for (const auto& [name, value] : options.ucx_config) {
    if (name == "TLS") tls = value;
  }
  return internal::TlsIncludesTcp(tls);
}

// How often the busy progress loop looks at deadlines and watched peer processes.
constexpr absl::Duration kHousekeepingPeriod = absl::Milliseconds(1);

}  // namespace

// Owns the ucp context and worker and runs the progress thread. Everything below that
// touches UCX runs on that thread, except context-level calls after the thread stopped.
class UcxTransferEngine::Worker {
 public:
  static absl::StatusOr<std::shared_ptr<Worker>> Create(const Options& options);
  ~Worker();

  void Start(UcxTransferEngine* engine);
  // Cancels what is in flight, closes endpoints, destroys the ucp worker, joins the thread.
  void Stop();

  const std::string& address() const { return address_; }
  ucp_context_h context() const { return context_; }
  bool OnThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  bool peer_failure_detection() const { return peer_failure_detection_.load(); }

  void Submit(Submission submission);
  // Runs `fn` on the progress thread and waits for it; inline on that thread, or once the
  // thread has stopped (context-level calls such as ucp_mem_unmap stay valid until the
  // context is cleaned up with the last reference to this Worker).
  void RunSync(absl::AnyInvocable<void()> fn);

 private:
  struct Peer;
  struct Batch {
    Worker* worker = nullptr;
    Submission s;
    Peer* peer = nullptr;
    int outstanding = 0;  // UCX requests (puts, flush) not completed yet
    bool posted = false;  // every put and the flush were issued
    absl::Status status;  // first error
    void Fail(const absl::Status& error) {
      if (status.ok()) status = error;
    }
  };
  struct Peer {
    Worker* worker = nullptr;
    std::string address;  // the engine address (cache key)
    ProcessIdentity owner;
    ucp_ep_h ep = nullptr;
    int pidfd = -1;           // the owner process, watched when it runs on this host
    bool watch_only = false;  // UCP_ERR_HANDLING_MODE_NONE: the pidfd is all there is
    absl::flat_hash_map<std::string, ucp_rkey_h> rkeys;  // packed rkey -> unpacked
    // Destinations (base, length, rkey) whose mapped extent was checked (Execute).
    absl::flat_hash_set<std::string> verified_extents;
    absl::flat_hash_set<Batch*> batches;                // in flight on this endpoint
    absl::Status failure;                               // set once the endpoint is dropped
    bool close_started = false;
    bool closed = false;
  };

  explicit Worker(const Options& options) : options_(options) {}
  absl::Status Init();

  void Loop();
  bool RunCommands();
  void BeginShutdown();
  void Execute(std::unique_ptr<Batch> batch);
  absl::StatusOr<Peer*> GetPeer(const std::string& address);
  absl::StatusOr<ucp_rkey_h> GetRkey(Peer* peer, const RemoteMemoryDescriptor& destination);
  void MaybeFinish(Batch* batch);
  void DropPeer(Peer* peer, const absl::Status& why);
  void StartClose(Peer* peer);
  void AfterProgress();
  void Housekeeping(absl::Time now);
  void PollEvents(int timeout_ms);
  void Wake();

  static void OnRequestDone(void* request, ucs_status_t status, void* user_data);
  static void OnCloseDone(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const Options options_;
  const ProcessIdentity self_ = ProcessIdentity::Self();
  UcxTransferEngine* engine_ = nullptr;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> peer_failure_detection_{true};

  // Hand-off from callers: `pending_` lets the busy loop skip the lock when nothing is
  // queued; `sleeping_` tells producers to write the eventfd.
  std::mutex mu_;  // guards commands_, stopping_, stopped_
  std::vector<absl::AnyInvocable<void()>> commands_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::atomic<bool> pending_{false};
  std::atomic<bool> sleeping_{false};
  std::mutex inline_mu_;  // serializes RunSync after the thread stopped, and the teardown

  // Progress-thread state.
  bool shutting_down_ = false;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_;  // live endpoints
  std::vector<std::unique_ptr<Peer>> dropped_;  // closing, or still referenced by batches
  absl::flat_hash_map<Batch*, std::unique_ptr<Batch>> in_flight_;
  std::vector<Batch*> finished_;  // their done runs after ucp_worker_progress returns
  int watched_peers_ = 0;         // peers with a pidfd in the epoll set
  bool local_peers_need_watch_ = false;  // UCP_ERR_HANDLING_MODE_PEER failed for one
  absl::Time next_housekeeping_ = absl::InfinitePast();
};

absl::StatusOr<std::shared_ptr<UcxTransferEngine::Worker>> UcxTransferEngine::Worker::Create(
    const Options& options) {
  std::shared_ptr<Worker> worker(new Worker(options));
  absl::Status status = worker->Init();
  if (!status.ok()) return status;
  return worker;
}

absl::Status UcxTransferEngine::Worker::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  std::vector<std::pair<std::string, std::string>> settings;
  if (options_.tune_tcp && TcpEnabled(options_)) {
    // Puts over tcp are active messages of at most one segment each (UCX's default 8 KiB,
    // 64 KiB on receive). Larger segments: 3-5 GB/s instead of 1.5 on loopback here. The
    // environment still decides where it says something. (Through ucp_config_modify a
    // transport setting goes by its name inside the transport: TX_SEG_SIZE, not TCP_...)
    if (std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr) settings.emplace_back("TX_SEG_SIZE", "256K");
    if (std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) settings.emplace_back("RX_SEG_SIZE", "1M");
  }
  settings.insert(settings.end(), options_.ucx_config.begin(), options_.ucx_config.end());
  for (const auto& [name, value] : settings) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(st, absl::StrCat("UCX setting ", name, "=", value));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = "tandem-transfer";
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_address");
  UcxPeerAddress published;
  published.owner = self_;
  published.worker_address.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);
  address_ = published.Encode();

  int worker_fd = -1;
  st = ucp_worker_get_efd(worker_, &worker_fd);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_get_efd");
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return absl::InternalError(ErrnoMessage("epoll_create1"));
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return absl::InternalError(ErrnoMessage("eventfd"));
  for (int fd : {worker_fd, event_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // a wake-up; peers' pidfds carry their Peer*
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(ErrnoMessage("epoll_ctl"));
    }
  }
  return absl::OkStatus();
}

UcxTransferEngine::Worker::~Worker() {
  TANDEM_CHECK(!thread_.joinable()) << "UCX transfer worker destroyed while running";
  if (worker_ != nullptr) ucp_worker_destroy(worker_);  // only if Start never ran
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (event_fd_ >= 0) close(event_fd_);
}

void UcxTransferEngine::Worker::Start(UcxTransferEngine* engine) {
  engine_ = engine;
  thread_ = std::thread([this] {
    thread_id_.store(std::this_thread::get_id());
    Loop();
  });
  while (thread_id_.load() == std::thread::id()) std::this_thread::yield();
}

void UcxTransferEngine::Worker::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  pending_.store(true);
  Wake();
  thread_.join();
}

void UcxTransferEngine::Worker::Wake() {
  const uint64_t one = 1;
  const ssize_t n = write(event_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN only when the counter is saturated: the thread is awake anyway
}

void UcxTransferEngine::Worker::Submit(Submission submission) {
  auto batch = std::make_unique<Batch>();
  batch->worker = this;
  batch->s = std::move(submission);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {  // the thread runs every command queued before it sets stopped_
      commands_.push_back([this, b = std::move(batch)]() mutable { Execute(std::move(b)); });
      pending_.store(true);
    }
  }
  if (batch != nullptr) {  // the engine is being destroyed and its thread is gone
    batch->s.done(absl::CancelledError("UCX transfer engine was shut down"));
    return;
  }
  if (sleeping_.load()) Wake();
}

void UcxTransferEngine::Worker::RunSync(absl::AnyInvocable<void()> fn) {
  if (OnThread()) {
    fn();
    return;
  }
  internal::Event done;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      commands_.push_back([&fn, &done] {
        fn();
        done.Notify();
      });
      pending_.store(true);
      queued = true;
    }
  }
  if (queued) {
    Wake();
    done.Wait();
    return;
  }
  std::lock_guard<std::mutex> lock(inline_mu_);
  fn();
}

bool UcxTransferEngine::Worker::RunCommands() {
  if (!pending_.load()) return false;
  std::vector<absl::AnyInvocable<void()>> commands;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands.swap(commands_);
    pending_.store(false);
    stopping = stopping_;
  }
  if (stopping && !shutting_down_) BeginShutdown();
  for (auto& command : commands) command();
  return !commands.empty();
}

void UcxTransferEngine::Worker::BeginShutdown() {
  shutting_down_ = true;
  const absl::Status cancelled = absl::CancelledError("UCX transfer engine was shut down");
  for (auto& [ptr, batch] : in_flight_) batch->Fail(cancelled);
  std::vector<Peer*> live;
  for (auto& [address, peer] : peers_) live.push_back(peer.get());
  for (Peer* peer : live) DropPeer(peer, cancelled);
}

void UcxTransferEngine::Worker::Loop() {
  absl::Time busy_until = absl::Now() + options_.idle_spin;
  while (true) {
    const bool ran = RunCommands();
    const unsigned progressed = ucp_worker_progress(worker_);
    AfterProgress();
    const absl::Time now = absl::Now();
    if (now >= next_housekeeping_) Housekeeping(now);

    if (shutting_down_ && in_flight_.empty() && dropped_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (commands_.empty()) {
        stopped_ = true;
        break;
      }
      continue;
    }
    if (ran || progressed != 0 || !in_flight_.empty() || !dropped_.empty()) {
      busy_until = now + options_.idle_spin;
      continue;
    }
    if (now < busy_until) continue;

    // Idle: arm the worker and sleep until UCX, a producer or a watched peer wakes us.
    sleeping_.store(true);
    if (!pending_.load() && ucp_worker_arm(worker_) == UCS_OK) PollEvents(-1);
    sleeping_.store(false);
    busy_until = absl::Now() + options_.idle_spin;
  }

  // Every endpoint is closed and every batch completed: release the worker on its own
  // thread (not concurrently with a RunSync that runs inline now). The context stays for
  // regions that are still registered.
  std::lock_guard<std::mutex> lock(inline_mu_);
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
}

// Waits up to timeout_ms (-1: forever) for the eventfd, the worker's fd or a watched peer
// process; drops peers whose process exited.
void UcxTransferEngine::Worker::PollEvents(int timeout_ms) {
  epoll_event events[16];
  const int n = epoll_wait(epoll_fd_, events, 16, timeout_ms);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.ptr == nullptr) continue;
    auto* peer = static_cast<Peer*>(events[i].data.ptr);
    DropPeer(peer, absl::UnavailableError(
                       absl::StrCat("KV transfer peer process ", peer->owner.pid, " exited")));
  }
  uint64_t drained;
  while (read(event_fd_, &drained, sizeof(drained)) > 0) {
  }
}

void UcxTransferEngine::Worker::Execute(std::unique_ptr<Batch> owned) {
  Batch* batch = owned.get();
  in_flight_[batch] = std::move(owned);
  Submission& s = batch->s;
  if (!s.error.ok()) {
    batch->Fail(s.error);
  } else if (shutting_down_) {
    batch->Fail(absl::CancelledError("UCX transfer engine was shut down"));
  } else if (absl::Now() > s.deadline) {
    batch->Fail(absl::DeadlineExceededError("transfer batch timed out before it started"));
  }
  if (!batch->status.ok() || s.puts.empty()) {
    batch->posted = true;
    MaybeFinish(batch);
    return;
  }

  absl::StatusOr<Peer*> peer = GetPeer(s.destination.engine_address);
  absl::StatusOr<ucp_rkey_h> rkey =
      peer.ok() ? GetRkey(*peer, s.destination) : absl::StatusOr<ucp_rkey_h>(peer.status());
  // Destination memory this process has mapped (UCX shared memory: ucp_rkey_ptr) is
  // written directly; anything else goes through ucp_put_nbx.
  void* local_view = nullptr;
  const bool mappable =
      rkey.ok() && ucp_rkey_ptr(*rkey, s.destination.base, &local_view) == UCS_OK;
  char* mapped = mappable && options_.direct_shared_memory ? static_cast<char*>(local_view)
                                                           : nullptr;
  if (mapped != nullptr) {
    // The copies below are bounded by the destination's length, which the peer's message
    // claims; ucp_rkey_ptr checks nothing. So the claim is checked once against what is
    // really mapped here (the segment UCX attached, /proc/self/maps) before any copy.
    const std::string key = absl::StrCat(s.destination.base, ":", s.destination.length, ":", s.destination.rkey);
    if (!(*peer)->verified_extents.contains(key)) {
      if (absl::Status extent = internal::CheckSharedMapping(mapped, s.destination.length); !extent.ok()) {
        rkey = extent;
      } else {
        (*peer)->verified_extents.insert(key);
      }
    }
  }
  if (rkey.ok() && !mappable && (*peer)->watch_only) {
    // Without UCX failure detection nothing may wait on the peer: a put into memory this
    // process cannot map (registered heap memory) is emulated with messages the peer must
    // answer, and a dead peer would leave them pending forever, holding the caller's
    // buffers. Mapped memory is written directly, so nothing ever waits.
    rkey = absl::FailedPreconditionError(
        "with shared-memory transports only (no peer failure detection in UCX 1.13), the "
        "destination must come from AllocateMemory; or add tcp to UCX_TLS");
  }
  if (!rkey.ok()) {
    batch->Fail(rkey.status());
    batch->posted = true;
    MaybeFinish(batch);
    return;
  }
  batch->peer = *peer;
  batch->peer->batches.insert(batch);
  next_housekeeping_ = std::min(next_housekeeping_, s.deadline);

  if (mapped != nullptr) {
    for (const PutOp& op : s.puts) {
      // The lease's write deadline, checked here, on the thread that copies, right before
      // each copy (docs/architecture.md, "KV leases": why that, plus the decode replica's
      // quarantine, keeps a late writer out of blocks reused by another request).
      if (absl::Status allowed = PutAllowed(s); !allowed.ok()) {
        batch->Fail(allowed);
        break;
      }
      CopyToMapped(mapped + op.remote_offset, op.local, op.length);
    }
    StoreFence();  // the copies are visible to the peer before done runs
    batch->posted = true;
    MaybeFinish(batch);
    return;
  }

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.send = &Worker::OnRequestDone;
  param.user_data = batch;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  ucp_ep_h ep = batch->peer->ep;
  for (const PutOp& op : s.puts) {
    if (absl::Status allowed = PutAllowed(s); !allowed.ok()) {  // as for the copies above
      batch->Fail(allowed);
      break;
    }
    ucs_status_ptr_t request = ucp_put_nbx(ep, op.local, op.length,
                                           s.destination.base + op.remote_offset, *rkey, &param);
    if (UCS_PTR_IS_ERR(request)) {
      batch->Fail(FromUcs(UCS_PTR_STATUS(request), "ucp_put_nbx"));
      break;
    }
    if (request != nullptr) ++batch->outstanding;
  }
  // Remote completion of everything issued on the endpoint so far (a put's own request
  // only means its local buffer may be reused).
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &param);
  if (UCS_PTR_IS_ERR(flush)) {
    batch->Fail(FromUcs(UCS_PTR_STATUS(flush), "ucp_ep_flush_nbx"));
  } else if (flush != nullptr) {
    ++batch->outstanding;
  }
  batch->posted = true;
  MaybeFinish(batch);
}

absl::StatusOr<UcxTransferEngine::Worker::Peer*> UcxTransferEngine::Worker::GetPeer(
    const std::string& address) {
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second.get();

  absl::StatusOr<UcxPeerAddress> decoded = UcxPeerAddress::Decode(address);
  if (!decoded.ok()) return decoded.status();
  auto peer = std::make_unique<Peer>();
  peer->worker = this;
  peer->address = address;
  peer->owner = decoded->owner;

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(decoded->worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Worker::OnEndpointError;
  params.err_handler.arg = peer.get();
  // A peer on this host (same boot, same pid namespace) is watched through a pidfd, whatever
  // UCX detects: writes into its shared memory complete without it, so only its process
  // can tell that it died.
  if (self_.CanWatch(peer->owner)) {
    absl::StatusOr<int> pidfd = internal::OpenProcessHandle(peer->owner);
    if (!pidfd.ok() && pidfd.status().code() == absl::StatusCode::kUnavailable) {
      engine_->CountEndpointFailure();
      return pidfd.status();  // the peer exited
    }
    if (pidfd.ok()) peer->pidfd = *pidfd;
  }
  // Once local peers needed the fallback below, skip the attempt (UCX logs an error for it).
  ucs_status_t st = peer->pidfd >= 0 && local_peers_need_watch_
                        ? UCS_ERR_UNREACHABLE
                        : ucp_ep_create(worker_, &params, &peer->ep);
  if (st == UCS_ERR_UNREACHABLE && !options_.require_peer_failure_detection &&
      peer->pidfd >= 0) {
    // UCX 1.13's shared-memory transports (posix, sysv, self) cannot detect a dead peer,
    // so with only those no lane qualifies for UCP_ERR_HANDLING_MODE_PEER. Connect
    // without it: the pidfd is then the only failure detection.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_, &params, &peer->ep);
    if (st == UCS_OK) {
      peer->watch_only = true;
      local_peers_need_watch_ = true;
      peer_failure_detection_.store(false);
    }
  }
  if (st != UCS_OK) {
    if (peer->pidfd >= 0) close(peer->pidfd);
    engine_->CountEndpointFailure();
    return FromUcs(st, "cannot connect to the transfer peer (ucp_ep_create)");
  }
  if (peer->pidfd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = peer.get();
    TANDEM_CHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, peer->pidfd, &ev) == 0)
        << ErrnoMessage("epoll_ctl(pidfd)");
    ++watched_peers_;
  }
  engine_->CountEndpointCreated();
  Peer* raw = peer.get();
  peers_[address] = std::move(peer);
  return raw;
}

absl::StatusOr<ucp_rkey_h> UcxTransferEngine::Worker::GetRkey(
    Peer* peer, const RemoteMemoryDescriptor& destination) {
  const std::string& packed = destination.rkey;
  auto it = peer->rkeys.find(packed);
  if (it != peer->rkeys.end()) return it->second;
  if (packed.empty()) return absl::InvalidArgumentError("the destination has no memory key");
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, packed.data(), &rkey);
  if (st != UCS_OK) return FromUcs(st, "the destination's memory key does not unpack");
  peer->rkeys[packed] = rkey;
  return rkey;
}

void UcxTransferEngine::Worker::OnRequestDone(void* request, ucs_status_t status,
                                              void* user_data) {
  auto* batch = static_cast<Batch*>(user_data);
  ucp_request_free(request);
  --batch->outstanding;
  if (status != UCS_OK) {
    // The peer's failure when known; a request cancelled otherwise means its endpoint was
    // closed under it (peer failure, timeout, shutdown each set the batch's status first).
    Peer* peer = batch->peer;
    batch->Fail(peer != nullptr && !peer->failure.ok() ? peer->failure
                : status == UCS_ERR_CANCELED
                    ? absl::UnavailableError("KV transfer endpoint was closed")
                    : FromUcs(status, "KV transfer put or flush failed"));
  }
  batch->worker->MaybeFinish(batch);
}

void UcxTransferEngine::Worker::MaybeFinish(Batch* batch) {
  if (!batch->posted || batch->outstanding > 0) return;
  Peer* peer = batch->peer;
  if (peer != nullptr) {
    // "Complete" may mean "written into the shared memory of a process that died" (direct
    // writes need nothing from the peer): report that as the failure it is.
    if (batch->status.ok() && peer->pidfd >= 0 && internal::ProcessExited(peer->pidfd)) {
      batch->Fail(absl::UnavailableError(
          absl::StrCat("KV transfer peer process ", peer->owner.pid, " exited")));
    }
    peer->batches.erase(batch);
  }
  finished_.push_back(batch);
}

void UcxTransferEngine::Worker::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->worker->DropPeer(peer, FromUcs(status, "KV transfer peer failed (endpoint error)"));
}

// Takes `peer` out of the cache (the next batch reconnects), fails its batches in flight
// with `why`, and schedules the endpoint's close; the Peer lives on in dropped_ until the
// close completed and no batch refers to it.
void UcxTransferEngine::Worker::DropPeer(Peer* peer, const absl::Status& why) {
  if (!peer->failure.ok()) return;
  peer->failure = why.code() == absl::StatusCode::kCancelled
                      ? why
                      : absl::UnavailableError(std::string(why.message()));
  for (Batch* batch : peer->batches) batch->Fail(peer->failure);
  if (peer->pidfd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer->pidfd, nullptr);
    close(peer->pidfd);
    peer->pidfd = -1;
    --watched_peers_;
  }
  auto it = peers_.find(peer->address);
  if (it != peers_.end() && it->second.get() == peer) {
    dropped_.push_back(std::move(it->second));
    peers_.erase(it);
  }
  if (!shutting_down_) engine_->CountEndpointFailure();
}

void UcxTransferEngine::Worker::StartClose(Peer* peer) {
  peer->close_started = true;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // completes outstanding requests with errors
  param.cb.send = &Worker::OnCloseDone;
  param.user_data = peer;
  ucs_status_ptr_t request = ucp_ep_close_nbx(peer->ep, &param);
  if (!UCS_PTR_IS_PTR(request)) peer->closed = true;  // done (or failed: nothing to wait for)
}

void UcxTransferEngine::Worker::OnCloseDone(void* request, ucs_status_t status,
                                            void* user_data) {
  ucp_request_free(request);
  static_cast<Peer*>(user_data)->closed = true;
}

void UcxTransferEngine::Worker::AfterProgress() {
  // Close dropped endpoints outside UCX callbacks; free them once nothing refers to them.
  for (size_t i = 0; i < dropped_.size(); ++i) {
    if (!dropped_[i]->close_started) StartClose(dropped_[i].get());
  }
  for (size_t i = 0; i < dropped_.size();) {
    Peer* peer = dropped_[i].get();
    if (peer->closed && peer->batches.empty()) {
      for (auto& [packed, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
      dropped_[i] = std::move(dropped_.back());
      dropped_.pop_back();
    } else {
      ++i;
    }
  }
  // Run done callbacks last: they may submit more work or destroy regions.
  while (!finished_.empty()) {
    std::vector<Batch*> finished;
    finished.swap(finished_);
    for (Batch* batch : finished) {
      auto it = in_flight_.find(batch);
      std::unique_ptr<Batch> owned = std::move(it->second);
      in_flight_.erase(it);
      engine_->CountBatch(owned->s, owned->status);
      owned->s.done(std::move(owned->status));
    }
  }
}

// Deadlines of batches in flight, and (while busy) watched peer processes.
void UcxTransferEngine::Worker::Housekeeping(absl::Time now) {
  next_housekeeping_ = watched_peers_ > 0 ? now + kHousekeepingPeriod : absl::InfiniteFuture();
  if (watched_peers_ > 0) PollEvents(0);
  std::vector<Peer*> expired;
  for (auto& [ptr, batch] : in_flight_) {
    if (batch->peer == nullptr || !batch->status.ok()) continue;
    if (batch->s.deadline <= now) {
      batch->Fail(absl::DeadlineExceededError(absl::StrCat(
          "KV transfer batch of ", batch->s.bytes, " bytes did not complete in time")));
      expired.push_back(batch->peer);
    } else {
      next_housekeeping_ = std::min(next_housekeeping_, batch->s.deadline);
    }
  }
  // The endpoint of a timed-out batch is closed by force: that is the only way to get its
  // outstanding requests back (and the caller's buffers free) from a stuck peer.
  for (Peer* peer : expired) {
    DropPeer(peer, absl::UnavailableError(
                       "KV transfer endpoint closed after a batch to the peer timed out"));
  }
}

UcxTransferEngine::UcxTransferEngine(std::shared_ptr<Worker> worker)
    : worker_(std::move(worker)) {}

absl::StatusOr<std::unique_ptr<UcxTransferEngine>> UcxTransferEngine::Create(Options options) {
  absl::StatusOr<std::shared_ptr<Worker>> worker = Worker::Create(options);
  if (!worker.ok()) return worker.status();
  std::unique_ptr<UcxTransferEngine> engine(new UcxTransferEngine(std::move(*worker)));
  engine->worker_->Start(engine.get());
  return engine;
}

UcxTransferEngine::~UcxTransferEngine() { worker_->Stop(); }

std::string UcxTransferEngine::address() const { return worker_->address(); }

bool UcxTransferEngine::peer_failure_detection() const {
  return worker_->peer_failure_detection();
}

void UcxTransferEngine::Submit(Submission submission) { worker_->Submit(std::move(submission)); }

bool UcxTransferEngine::OnCompletionThread() const { return worker_->OnThread(); }

class UcxTransferEngine::Region final : public MemoryRegion {
 public:
  Region(std::shared_ptr<Worker> worker, ucp_mem_h memh, void* base, size_t length,
         RemoteMemoryDescriptor d)
      : MemoryRegion(base, length, std::move(d)), worker_(std::move(worker)), memh_(memh) {}
  ~Region() override {
    worker_->RunSync([this] { ucp_mem_unmap(worker_->context(), memh_); });
  }

 private:
  std::shared_ptr<Worker> worker_;
  ucp_mem_h memh_;
};

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransferEngine::RegisterMemory(void* base,
                                                                                size_t length) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory of a null or empty range");
  }
  return MapMemory(base, length);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransferEngine::AllocateMemory(size_t length) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory of 0 bytes");
  return MapMemory(nullptr, length);
}

// ucp_mem_map of [base, base + length), or of new memory when base is null (UCX allocates
// it, from shared memory where a shared-memory transport is enabled).
absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxTransferEngine::MapMemory(void* base,
                                                                           size_t length) {
  const bool allocate = base == nullptr;
  absl::Status status;
  ucp_mem_h memh = nullptr;
  std::string rkey;
  worker_->RunSync([&] {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base;
    params.length = length;
    if (allocate) {
      params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      params.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucs_status_t st = ucp_mem_map(worker_->context(), &params, &memh);
    if (st != UCS_OK) {
      status = FromUcs(st, "ucp_mem_map");
      return;
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    void* packed = nullptr;
    size_t packed_size = 0;
    if (st == UCS_OK) st = ucp_rkey_pack(worker_->context(), memh, &packed, &packed_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(worker_->context(), memh);
      status = FromUcs(st, "ucp_mem_query / ucp_rkey_pack");
      return;
    }
    if (allocate) base = attr.address;
    rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
  });
  if (!status.ok()) return status;
  if (allocate) std::memset(base, 0, length);  // UCX's heap fallback does not zero
  RemoteMemoryDescriptor d;
  d.transport = std::string(transport());
  d.engine_address = worker_->address();
  d.base = reinterpret_cast<uint64_t>(base);
  d.length = length;
  d.rkey = std::move(rkey);
  return std::unique_ptr<MemoryRegion>(new Region(worker_, memh, base, length, std::move(d)));
}

}  // namespace tandem::transfer
