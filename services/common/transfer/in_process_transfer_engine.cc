#include "services/common/transfer/in_process_transfer_engine.h"

#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::transfer {

// One engine's registered regions, shared with the process-wide table.
struct internal::InProcessNode {
  std::string address;
  std::mutex mu;  // guards the members below
  uint64_t next_region_id = 1;
  struct Range {
    char* base;
    size_t length;
  };
  absl::flat_hash_map<uint64_t, Range> regions;
  absl::Status injected;
};

namespace {

struct Registry {
  std::mutex mu;  // guards the members below
  uint64_t next_engine = 1;
  absl::flat_hash_map<std::string, std::weak_ptr<internal::InProcessNode>> nodes;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: engines may outlive main
  return *registry;
}

}  // namespace

class InProcessTransferEngine::Region final : public MemoryRegion {
 public:
  Region(std::shared_ptr<Node> node, uint64_t id, void* base, size_t length,
         RemoteMemoryDescriptor d, bool owned)
      : MemoryRegion(base, length, std::move(d)), node_(std::move(node)), id_(id), owned_(owned) {}
  ~Region() override {
    {
      // Waits for a memcpy into this region in progress (it holds the node's lock).
      std::lock_guard<std::mutex> lock(node_->mu);
      node_->regions.erase(id_);
    }
    if (owned_) std::free(base());
  }

 private:
  std::shared_ptr<Node> node_;
  uint64_t id_;
  bool owned_;
};

// The completion thread: runs submissions in order.
class InProcessTransferEngine::Completer {
 public:
  explicit Completer(InProcessTransferEngine* engine)
      : engine_(engine), thread_([this] { Run(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void Push(Submission s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(s));
    }
    cv_.notify_one();
  }
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Run() {
    while (true) {
      Submission s;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        s = std::move(queue_.front());
        queue_.pop_front();
      }
      engine_->Execute(s);
    }
  }

  InProcessTransferEngine* engine_;
  std::mutex mu_;  // guards queue_ and stopping_
  std::condition_variable cv_;
  std::deque<Submission> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

InProcessTransferEngine::InProcessTransferEngine() : node_(std::make_shared<Node>()) {
  Registry& registry = GetRegistry();
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    node_->address = absl::StrCat("inproc:", registry.next_engine++);
    registry.nodes[node_->address] = node_;
  }
  completer_ = std::make_unique<Completer>(this);
}

InProcessTransferEngine::~InProcessTransferEngine() {
  completer_.reset();  // drains the queue
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.nodes.erase(node_->address);
}

std::string InProcessTransferEngine::address() const { return node_->address; }

absl::StatusOr<std::unique_ptr<MemoryRegion>> InProcessTransferEngine::RegisterMemory(
    void* base, size_t length) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory of a null or empty range");
  }
  return Map(base, length, /*owned=*/false);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> InProcessTransferEngine::AllocateMemory(
    size_t length) {
  if (length == 0) return absl::InvalidArgumentError("AllocateMemory of 0 bytes");
  constexpr size_t kPage = 4096;
  const size_t rounded = (length + kPage - 1) / kPage * kPage;
  void* base = std::aligned_alloc(kPage, rounded);
  if (base == nullptr) return absl::ResourceExhaustedError("AllocateMemory: out of memory");
  std::memset(base, 0, rounded);
  return Map(base, length, /*owned=*/true);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> InProcessTransferEngine::Map(void* base,
                                                                         size_t length,
                                                                         bool owned) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(node_->mu);
    id = node_->next_region_id++;
    node_->regions[id] = Node::Range{static_cast<char*>(base), length};
  }
  RemoteMemoryDescriptor d;
  d.transport = std::string(transport());
  d.engine_address = node_->address;
  d.base = reinterpret_cast<uint64_t>(base);
  d.length = length;
  d.rkey = absl::StrCat(id);
  return std::unique_ptr<MemoryRegion>(
      new Region(node_, id, base, length, std::move(d), owned));
}

void InProcessTransferEngine::InjectFailure(absl::Status status) {
  std::lock_guard<std::mutex> lock(node_->mu);
  node_->injected = std::move(status);
}

void InProcessTransferEngine::Submit(Submission submission) {
  completer_->Push(std::move(submission));
}

bool InProcessTransferEngine::OnCompletionThread() const { return completer_->OnThread(); }

void InProcessTransferEngine::Execute(Submission& s) {
  absl::Status status = s.error;
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(node_->mu);
    status = node_->injected;
  }
  if (status.ok() && absl::Now() > s.deadline) {
    status = absl::DeadlineExceededError("transfer batch timed out before it started");
  }
  std::shared_ptr<Node> peer;
  if (status.ok()) {
    Registry& registry = GetRegistry();
    std::lock_guard<std::mutex> lock(registry.mu);
    auto it = registry.nodes.find(s.destination.engine_address);
    if (it != registry.nodes.end()) peer = it->second.lock();
    if (peer == nullptr) {
      status = absl::UnavailableError(absl::StrCat(
          "in-process transfer peer '", s.destination.engine_address, "' is gone"));
    }
  }
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(peer->mu);
    uint64_t id = 0;
    auto region = absl::SimpleAtoi(s.destination.rkey, &id) ? peer->regions.find(id)
                                                             : peer->regions.end();
    if (region == peer->regions.end()) {
      status = absl::FailedPreconditionError("destination region is no longer registered");
    } else {
      const uint64_t start = reinterpret_cast<uint64_t>(region->second.base);
      if (s.destination.base < start ||
          s.destination.base - start > region->second.length ||
          s.destination.length > region->second.length - (s.destination.base - start)) {
        status = absl::InvalidArgumentError("destination lies outside its registered region");
      } else {
        for (const PutOp& op : s.puts) {
          status = PutAllowed(s);
          if (!status.ok()) break;
          std::memcpy(reinterpret_cast<char*>(s.destination.base + op.remote_offset), op.local,
                      op.length);
        }
      }
    }
  }
  CountBatch(s, status);
  s.done(std::move(status));
}

}  // namespace tandem::transfer
