#include "services/kvstore/kvstore_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"
#include "engine/runtime/block_hash.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "xxhash.h"

namespace tandem::kvstore {
namespace {

// What one callback-API call needs alive until it completes.
template <typename Request, typename Response>
struct Call {
  grpc::ClientContext ctx;
  Request req;
  Response resp;
};

// The request a call serves, for the kvstore's logs (gRPC metadata, as the router sends
// it to the workers).
void TagRequest(grpc::ClientContext& ctx, const std::string& request_id) {
  if (!request_id.empty()) ctx.AddMetadata("x-request-id", request_id);
}

}  // namespace

struct KvStoreClient::Snapshot {
  HashRing ring;
  std::vector<std::shared_ptr<v1::KvStore::Stub>> stubs;  // by ring node index

  explicit Snapshot(int vnodes) : ring(vnodes) {}
  // Chain positions [from, to) of `hashes` by owning node, in calls of at most
  // `max_per_call` positions each (a node's positions split in chain order).
  std::vector<std::pair<int, std::vector<int32_t>>> Group(const std::vector<uint64_t>& hashes, int32_t from,
                                                          int32_t to, int max_per_call) const {
    std::map<int, std::vector<int32_t>> by_node;
    for (int32_t p = from; p < to; ++p) by_node[ring.Owner(hashes[static_cast<size_t>(p)])].push_back(p);
    std::vector<std::pair<int, std::vector<int32_t>>> calls;
    const size_t cap = static_cast<size_t>(std::max(max_per_call, 1));
    for (auto& [node, positions] : by_node) {
      for (size_t i = 0; i < positions.size(); i += cap) {
        const size_t n = std::min(cap, positions.size() - i);
        calls.emplace_back(node, std::vector<int32_t>(positions.begin() + static_cast<std::ptrdiff_t>(i),
                                                      positions.begin() + static_cast<std::ptrdiff_t>(i + n)));
      }
    }
    return calls;
  }
};

// Block-sized slots of the staging region. Slots held back after a failed get come back
// once their quarantine passes (checked on the next Allocate).
class KvStoreClient::StagingPool {
 public:
  StagingPool(char* base, int64_t block_bytes, int64_t slots) : base_(base), block_bytes_(block_bytes) {
    for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  }
  std::vector<int32_t> Allocate(int32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    while (!quarantined_.empty() && quarantined_.front().first <= now) {
      free_.insert(free_.end(), quarantined_.front().second.begin(), quarantined_.front().second.end());
      quarantined_.pop_front();
    }
    std::vector<int32_t> out;
    while (static_cast<int32_t>(out.size()) < n && !free_.empty()) {
      out.push_back(free_.back());
      free_.pop_back();
    }
    return out;
  }
  void Release(const std::vector<int32_t>& slots) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.insert(free_.end(), slots.begin(), slots.end());
  }
  void Quarantine(std::vector<int32_t> slots, absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    quarantined_.emplace_back(absl::Now() + d, std::move(slots));
  }
  char* data(int32_t s) const { return base_ + offset(s); }
  int64_t offset(int32_t s) const { return static_cast<int64_t>(s) * block_bytes_; }

 private:
  char* base_;
  int64_t block_bytes_;
  std::mutex mu_;
  std::vector<int32_t> free_;
  std::deque<std::pair<absl::Time, std::vector<int32_t>>> quarantined_;
};

namespace {

// Owns one fetch's staging slots (through PrefixKv::owner): back to the pool when the
// engine drops it, or later when a get failed (its writes may still land).
struct StagingLease {
  std::function<void(std::vector<int32_t>, bool)> give_back;
  std::vector<int32_t> slots;
  bool quarantine = false;
  ~StagingLease() { give_back(std::move(slots), quarantine); }
};

}  // namespace

struct KvStoreClient::FetchOp {
  FetchRequest req;
  std::function<void(FetchResult)> done;
  std::shared_ptr<const Snapshot> snap;
  absl::Time deadline;
  std::mutex mu;
  int pending = 0;
  bool failed = false;
  bool may_have_written = false;  // a failed get may still write into the staging slots
  int32_t stored = 0;  // lookup: the stored prefix
  int32_t state_end = 0;  // state lookup: the furthest block whose state is stored (0: none)
  // get: what moves (blocks [first_block, ...) then the state's chunks), how many of them
  // are blocks, how many leading ones were delivered, and their checksums
  std::vector<uint64_t> get_hashes;
  int32_t get_blocks = 0;
  int32_t end = 0;
  std::vector<uint64_t> checksums;
  std::shared_ptr<StagingLease> lease;
  FetchResult result;
};

struct KvStoreClient::OffloadOp {
  OffloadRequest req;
  std::shared_ptr<const Snapshot> snap;
  absl::Time deadline;
  int64_t bytes = 0;
  std::mutex mu;
  int pending = 0;
};

KvStoreClient::KvStoreClient(transfer::TransferEngine* transfer, KvStoreClientOptions options)
    : transfer_(transfer), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<KvStoreClient>> KvStoreClient::Create(transfer::TransferEngine* transfer,
                                                                     KvStoreClientOptions options) {
  if (options.block_bytes <= 0 || options.block_bytes % static_cast<int64_t>(sizeof(float)) != 0) {
    return absl::InvalidArgumentError("kvstore client: block_bytes must be a positive multiple of 4");
  }
  const int64_t slots = static_cast<int64_t>(options.staging_bytes) / options.block_bytes;
  if (slots < 1) return absl::InvalidArgumentError("kvstore client: the staging region holds no block");
  std::unique_ptr<KvStoreClient> c(new KvStoreClient(transfer, options));
  absl::StatusOr<std::unique_ptr<transfer::MemoryRegion>> region =
      transfer->AllocateMemory(static_cast<size_t>(slots * options.block_bytes));
  if (!region.ok()) return region.status();
  c->staging_region_ = std::move(*region);
  c->staging_descriptor_ = c->staging_region_->descriptor().Serialize();
  c->staging_ = std::make_shared<StagingPool>(static_cast<char*>(c->staging_region_->base()), options.block_bytes, slots);
  return c;
}

KvStoreClient::~KvStoreClient() {
  std::unique_lock<std::mutex> lock(ops_mu_);
  ops_cv_.wait(lock, [this] { return ops_in_flight_ == 0; });
}

void KvStoreClient::OpStarted() {
  std::lock_guard<std::mutex> lock(ops_mu_);
  ops_in_flight_++;
}

void KvStoreClient::OpDone() {
  std::lock_guard<std::mutex> lock(ops_mu_);
  if (--ops_in_flight_ == 0) ops_cv_.notify_all();
}

void KvStoreClient::SetInstances(std::vector<Instance> instances) {
  std::lock_guard<std::mutex> lock(mu_);
  auto snap = std::make_shared<Snapshot>(options_.vnodes);
  std::map<std::string, std::string> address_of;  // name -> address; a repeated name: the last wins
  for (const Instance& i : instances) {
    if (!i.name.empty() && !i.address.empty()) address_of[i.name] = i.address;
  }
  for (const auto& [name, address] : address_of) snap->ring.Add(name);
  std::map<std::string, std::shared_ptr<v1::KvStore::Stub>> stubs;
  for (const std::string& name : snap->ring.nodes()) {
    const std::string& address = address_of[name];
    auto it = stubs_.find(address);
    std::shared_ptr<v1::KvStore::Stub> stub =
        it != stubs_.end() ? it->second
                           : std::shared_ptr<v1::KvStore::Stub>(v1::KvStore::NewStub(
                                 security::OpenChannel(options_.channel_factory, address)));
    stubs[address] = stub;
    snap->stubs.push_back(stub);
  }
  stubs_ = std::move(stubs);  // channels of instances that left close when their calls end
  snapshot_ = std::move(snap);
}

std::vector<KvStoreClient::Instance> KvStoreClient::instances() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Instance> out;
  if (!snapshot_) return out;
  // Addresses by stub identity.
  for (size_t i = 0; i < snapshot_->ring.nodes().size(); ++i) {
    for (const auto& [address, stub] : stubs_) {
      if (stub == snapshot_->stubs[i]) out.push_back({snapshot_->ring.nodes()[i], address});
    }
  }
  return out;
}

std::shared_ptr<const KvStoreClient::Snapshot> KvStoreClient::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

bool KvStoreClient::available() const {
  std::shared_ptr<const Snapshot> s = snapshot();
  return s != nullptr && !s->ring.empty();
}

v1::KvBlockFormat KvStoreClient::Format() const {
  v1::KvBlockFormat f;
  f.set_layout_fingerprint(options_.layout_fingerprint);
  f.set_block_bytes(options_.block_bytes);
  f.set_block_tokens(options_.block_tokens);
  return f;
}

KvStoreClientStats KvStoreClient::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---- Fetch ----

void KvStoreClient::Fetch(FetchRequest request, std::function<void(FetchResult)> done) {
  std::shared_ptr<const Snapshot> snap = snapshot();
  if (snap == nullptr || snap->ring.empty() || request.hashes.empty()) {
    done(FetchResult{});
    return;
  }
  auto op = std::make_shared<FetchOp>();
  op->req = std::move(request);
  op->done = std::move(done);
  op->snap = snap;
  op->deadline = absl::Now() + options_.fetch_timeout;
  const int32_t n = static_cast<int32_t>(op->req.hashes.size());
  op->stored = n;
  Count([n](KvStoreClientStats& s) {
    s.fetches++;
    s.lookup_blocks += n;
  });
  OpStarted();
  std::vector<std::pair<int, std::vector<int32_t>>> groups =
      snap->Group(op->req.hashes, 0, n, options_.max_hashes_per_call);
  op->pending = static_cast<int>(groups.size());
  for (auto& [node, group] : groups) {
    auto call = std::make_shared<Call<v1::KvLookupRequest, v1::KvLookupResponse>>();
    call->ctx.set_deadline(absl::ToChronoTime(op->deadline));
    TagRequest(call->ctx, op->req.request_id);
    *call->req.mutable_format() = Format();
    for (int32_t p : group) call->req.add_block_hashes(op->req.hashes[static_cast<size_t>(p)]);
    snap->stubs[static_cast<size_t>(node)]->async()->Lookup(
        &call->ctx, &call->req, &call->resp, [this, op, call, positions = std::move(group)](grpc::Status s) {
          bool last;
          {
            std::lock_guard<std::mutex> lock(op->mu);
            if (!s.ok()) {
              op->failed = true;
            } else if (const int32_t c = call->resp.num_cached(); c < static_cast<int32_t>(positions.size())) {
              op->stored = std::min(op->stored, positions[static_cast<size_t>(std::max(c, 0))]);
            }
            last = --op->pending == 0;
          }
          if (last) AfterLookup(op);
        });
  }
}

void KvStoreClient::AfterLookup(std::shared_ptr<FetchOp> op) {
  if (op->failed) {
    Count([](KvStoreClientStats& s) { s.fetch_errors++; });
    FinishFetch(std::move(op));
    return;
  }
  op->result.available = true;
  op->result.stored_prefix = op->stored;
  Count([n = op->stored](KvStoreClientStats& s) { s.lookup_hit_blocks += n; });
  const int32_t from = std::max(op->req.first_block, 0);
  const int32_t to = std::min(op->stored, op->req.end_block);
  if (options_.state_bytes > 0) {
    LookUpStates(std::move(op), from, to);
    return;
  }
  if (to <= from || absl::Now() >= op->deadline) {
    FinishFetch(std::move(op));
    return;
  }
  op->get_hashes.assign(op->req.hashes.begin() + from, op->req.hashes.begin() + to);
  op->get_blocks = to - from;
  StartGet(std::move(op));
}

void KvStoreClient::LookUpStates(std::shared_ptr<FetchOp> op, int32_t from, int32_t to) {
  // Candidate ends k in [max(from, 1), to]: the state after block k - 1. (k == from brings
  // only the state, for blocks the replica holds without it.)
  const int32_t first = std::max(from, 1);
  if (to < first || absl::Now() >= op->deadline) {
    FinishFetch(std::move(op));
    return;
  }
  std::vector<uint64_t> firsts;
  for (int32_t k = first; k <= to; ++k) firsts.push_back(StateChunkHash(op->req.hashes[static_cast<size_t>(k - 1)], 0));
  std::vector<std::pair<int, std::vector<int32_t>>> groups =
      op->snap->Group(firsts, 0, static_cast<int32_t>(firsts.size()), options_.max_hashes_per_call);
  op->pending = static_cast<int>(groups.size());
  using LookupCall = Call<v1::KvLookupRequest, v1::KvLookupResponse>;
  std::vector<std::shared_ptr<LookupCall>> calls;
  for (auto& [node, group] : groups) {
    auto call = std::make_shared<LookupCall>();
    call->ctx.set_deadline(absl::ToChronoTime(op->deadline));
    TagRequest(call->ctx, op->req.request_id);
    *call->req.mutable_format() = Format();
    call->req.set_each(true);
    for (int32_t i : group) call->req.add_block_hashes(firsts[static_cast<size_t>(i)]);
    calls.push_back(std::move(call));
  }
  const std::shared_ptr<const Snapshot> snap = op->snap;
  for (size_t c = 0; c < groups.size(); ++c) {
    auto& [node, group] = groups[c];
    std::shared_ptr<LookupCall> call = std::move(calls[c]);
    snap->stubs[static_cast<size_t>(node)]->async()->Lookup(
        &call->ctx, &call->req, &call->resp, [this, op, call, first, positions = std::move(group)](grpc::Status s) {
          bool last;
          {
            std::lock_guard<std::mutex> lock(op->mu);
            // A failed answer holds nothing: those ends are not candidates.
            if (!s.ok()) Count([](KvStoreClientStats& st) { st.fetch_errors++; });
            const int n = s.ok() ? std::min(call->resp.held_size(), static_cast<int>(positions.size())) : 0;
            for (int i = 0; i < n; ++i) {
              if (!call->resp.held(i)) continue;
              op->state_end = std::max(op->state_end, first + positions[static_cast<size_t>(i)]);
            }
            last = --op->pending == 0;
          }
          if (!last) return;
          op->result.stored_state_end = op->state_end;
          if (op->state_end == 0 || op->state_end <= op->req.min_state_end) {
            FinishFetch(op);
            return;
          }
          const int32_t begin = std::max(op->req.first_block, 0);
          op->get_hashes.assign(op->req.hashes.begin() + begin, op->req.hashes.begin() + op->state_end);
          op->get_blocks = op->state_end - begin;
          const uint64_t at = op->req.hashes[static_cast<size_t>(op->state_end - 1)];
          for (int32_t i = 0; i < state_chunks(); ++i) {
            op->get_hashes.push_back(StateChunkHash(at, static_cast<uint32_t>(i)));
          }
          StartGet(op);
        });
  }
}

void KvStoreClient::StartGet(std::shared_ptr<FetchOp> op) {
  const int32_t total = static_cast<int32_t>(op->get_hashes.size());
  std::vector<int32_t> slots = staging_->Allocate(total);
  int32_t to = total;
  if (static_cast<int32_t>(slots.size()) < total) {
    Count([](KvStoreClientStats& s) { s.staging_exhausted++; });
    // Fewer blocks are still a prefix; without its state a prefix is nothing.
    to = options_.state_bytes > 0 ? 0 : static_cast<int32_t>(slots.size());
  }
  auto lease = std::make_shared<StagingLease>();
  lease->give_back = [pool = staging_, q = options_.quarantine](std::vector<int32_t> s, bool quarantine) {
    if (quarantine) pool->Quarantine(std::move(s), q);
    else pool->Release(s);
  };
  lease->slots = std::move(slots);
  op->lease = lease;
  if (to <= 0 || absl::Now() >= op->deadline) {
    FinishFetch(std::move(op));
    return;
  }
  op->end = to;
  op->checksums.assign(static_cast<size_t>(to), 0);
  std::vector<std::pair<int, std::vector<int32_t>>> groups =
      op->snap->Group(op->get_hashes, 0, to, options_.max_hashes_per_call);
  op->pending = static_cast<int>(groups.size());
  // Every call is built before any is sent, and this frame's reference to the lease is
  // dropped first: the last get may finish on another thread before this returns, and the
  // slots must go back the moment the engine drops the result, not when this frame ends.
  using GetCall = Call<v1::KvGetRequest, v1::KvGetResponse>;
  std::vector<std::shared_ptr<GetCall>> calls;
  for (auto& [node, group] : groups) {
    auto call = std::make_shared<GetCall>();
    call->ctx.set_deadline(absl::ToChronoTime(op->deadline));
    TagRequest(call->ctx, op->req.request_id);
    *call->req.mutable_format() = Format();
    call->req.set_destination(staging_descriptor_);
    for (int32_t p : group) {
      call->req.add_block_hashes(op->get_hashes[static_cast<size_t>(p)]);
      call->req.add_offsets(static_cast<uint64_t>(staging_->offset(lease->slots[static_cast<size_t>(p)])));
    }
    calls.push_back(std::move(call));
  }
  lease.reset();
  const std::shared_ptr<const Snapshot> snap = op->snap;
  for (size_t i = 0; i < groups.size(); ++i) {
    auto& [node, group] = groups[i];
    std::shared_ptr<GetCall> call = std::move(calls[i]);
    snap->stubs[static_cast<size_t>(node)]->async()->Get(
        &call->ctx, &call->req, &call->resp, [this, op, call, positions = std::move(group)](grpc::Status s) {
          bool last;
          {
            std::lock_guard<std::mutex> lock(op->mu);
            int32_t delivered = 0;
            if (!s.ok()) {
              op->failed = true;
              // A busy instance refuses before it writes anything; any other failure may
              // leave puts in flight into the staging slots.
              if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) op->may_have_written = true;
            } else {
              delivered = std::min(call->resp.num_delivered(), call->resp.checksums_size());
              delivered = std::clamp(delivered, 0, static_cast<int32_t>(positions.size()));
            }
            for (int32_t i = 0; i < delivered; ++i) {
              op->checksums[static_cast<size_t>(positions[static_cast<size_t>(i)])] = call->resp.checksums(i);
            }
            if (delivered < static_cast<int32_t>(positions.size())) {
              op->end = std::min(op->end, positions[static_cast<size_t>(delivered)]);
            }
            last = --op->pending == 0;
          }
          if (last) AfterGet(op);
        });
  }
}

void KvStoreClient::AfterGet(std::shared_ptr<FetchOp> op) {
  if (op->failed) {
    op->lease->quarantine = op->may_have_written;
    Count([](KvStoreClientStats& s) { s.fetch_errors++; });
  }
  int32_t end = op->end;
  for (int32_t i = 0; i < end; ++i) {
    const int32_t slot = op->lease->slots[static_cast<size_t>(i)];
    const uint64_t actual = XXH3_64bits(staging_->data(slot), static_cast<size_t>(options_.block_bytes));
    if (actual != op->checksums[static_cast<size_t>(i)]) {
      Count([](KvStoreClientStats& s) { s.checksum_mismatches++; });
      end = i;
      break;
    }
  }
  const bool with_state = options_.state_bytes > 0;
  // Blocks are a prefix as far as they arrived; a state arrives whole or not at all (and
  // is of no use without every block before it).
  if (with_state && end < static_cast<int32_t>(op->get_hashes.size())) end = 0;
  const int32_t blocks = std::min(end, op->get_blocks);
  if (end > 0) {
    const int32_t from = std::max(op->req.first_block, 0);
    auto kv = std::make_shared<PrefixKv>();
    kv->first_block = from;
    kv->hashes.assign(op->req.hashes.begin() + from, op->req.hashes.begin() + from + blocks);
    for (int32_t i = 0; i < blocks; ++i) {
      kv->blocks.push_back(reinterpret_cast<const float*>(staging_->data(op->lease->slots[static_cast<size_t>(i)])));
    }
    if (with_state) {
      int64_t left = options_.state_bytes;
      for (int32_t i = blocks; i < end; ++i) {
        const int64_t n = std::min(left, options_.block_bytes);
        const char* chunk = staging_->data(op->lease->slots[static_cast<size_t>(i)]);
        kv->state.emplace_back(reinterpret_cast<const std::byte*>(chunk), static_cast<size_t>(n));
        left -= n;
      }
      kv->state_hash = op->req.hashes[static_cast<size_t>(op->state_end - 1)];
    }
    kv->owner = op->lease;
    op->result.prefix = std::move(kv);
    Count([end, bytes = options_.block_bytes](KvStoreClientStats& s) {
      s.fetched_blocks += end;
      s.fetched_bytes += end * bytes;
    });
  }
  FinishFetch(std::move(op));
}

void KvStoreClient::FinishFetch(std::shared_ptr<FetchOp> op) {
  op->lease.reset();  // the result's PrefixKv holds it when it is used
  std::function<void(FetchResult)> done = std::move(op->done);
  FetchResult result = std::move(op->result);
  op.reset();
  done(std::move(result));
  OpDone();
}

// ---- Offload ----

void KvStoreClient::Offload(OffloadRequest request) {
  std::shared_ptr<const Snapshot> snap = snapshot();
  const int64_t bytes = static_cast<int64_t>(request.data.size() * sizeof(float));
  if (snap == nullptr || snap->ring.empty() || request.hashes.empty() ||
      bytes != static_cast<int64_t>(request.hashes.size()) * options_.block_bytes) {
    Count([](KvStoreClientStats& s) { s.offload_dropped++; });
    return;
  }
  if (offload_bytes_in_flight_.fetch_add(bytes) + bytes > options_.max_offload_bytes) {
    offload_bytes_in_flight_.fetch_sub(bytes);
    Count([](KvStoreClientStats& s) { s.offload_dropped++; });
    return;
  }
  auto op = std::make_shared<OffloadOp>();
  op->req = std::move(request);
  op->snap = snap;
  op->deadline = absl::Now() + options_.offload_timeout;
  op->bytes = bytes;
  Count([](KvStoreClientStats& s) { s.offloads++; });
  OpStarted();
  std::vector<std::pair<int, std::vector<int32_t>>> groups =
      snap->Group(op->req.hashes, 0, static_cast<int32_t>(op->req.hashes.size()), options_.max_hashes_per_call);
  op->pending = static_cast<int>(groups.size());
  for (auto& [node, group] : groups) {
    std::shared_ptr<v1::KvStore::Stub> stub = snap->stubs[static_cast<size_t>(node)];
    auto call = std::make_shared<Call<v1::KvReserveRequest, v1::KvReserveResponse>>();
    call->ctx.set_deadline(absl::ToChronoTime(op->deadline));
    TagRequest(call->ctx, op->req.request_id);
    *call->req.mutable_format() = Format();
    for (int32_t p : group) call->req.add_block_hashes(op->req.hashes[static_cast<size_t>(p)]);
    stub->async()->Reserve(&call->ctx, &call->req, &call->resp, [this, op, call, stub,
                                                                 positions = std::move(group)](grpc::Status s) {
      const v1::KvReserveResponse& r = call->resp;
      if (!s.ok() || r.offsets_size() != static_cast<int>(positions.size())) {
        Count([](KvStoreClientStats& st) { st.offload_errors++; });
        OffloadShardDone(op);
        return;
      }
      int64_t skipped = 0;
      for (int64_t o : r.offsets()) skipped += o < 0 ? 1 : 0;
      Count([skipped](KvStoreClientStats& st) { st.offload_dedup_blocks += skipped; });
      if (r.reservation_id().empty()) {
        OffloadShardDone(op);
        return;
      }
      auto commit = std::make_shared<Call<v1::KvCommitRequest, v1::KvCommitResponse>>();
      TagRequest(commit->ctx, op->req.request_id);
      commit->req.set_reservation_id(r.reservation_id());
      absl::StatusOr<transfer::RemoteMemoryDescriptor> dest = transfer::RemoteMemoryDescriptor::Parse(r.memory_descriptor());
      absl::Status st = dest.status();
      std::unique_ptr<transfer::TransferBatch> batch;
      std::vector<uint64_t> hashes, checksums;
      if (st.ok()) {
        batch = transfer_->NewBatch(*dest);
        const char* data = reinterpret_cast<const char*>(op->req.data.data());
        for (size_t i = 0; i < positions.size() && st.ok(); ++i) {
          if (r.offsets(static_cast<int>(i)) < 0) continue;
          const char* block = data + static_cast<int64_t>(positions[i]) * options_.block_bytes;
          st = batch->Put(block, static_cast<size_t>(options_.block_bytes), static_cast<uint64_t>(r.offsets(static_cast<int>(i))));
          hashes.push_back(op->req.hashes[static_cast<size_t>(positions[i])]);
          checksums.push_back(XXH3_64bits(block, static_cast<size_t>(options_.block_bytes)));
        }
      }
      auto send_commit = [this, op, stub, commit](absl::Status put_status, std::vector<uint64_t> hashes,
                                                  std::vector<uint64_t> checksums) {
        if (put_status.ok()) {
          for (size_t i = 0; i < hashes.size(); ++i) {
            commit->req.add_block_hashes(hashes[i]);
            commit->req.add_checksums(checksums[i]);
          }
        }
        // After a failed put the empty commit frees the slots at once.
        commit->ctx.set_deadline(absl::ToChronoTime(std::max(op->deadline, absl::Now() + absl::Seconds(1))));
        stub->async()->Commit(&commit->ctx, &commit->req, &commit->resp,
                              [this, op, commit, put_ok = put_status.ok()](grpc::Status cs) {
                                if (cs.ok() && put_ok) {
                                  const int64_t n = commit->resp.committed();
                                  Count([n, bytes = options_.block_bytes](KvStoreClientStats& s) {
                                    s.offload_blocks += n;
                                    s.offload_bytes += n * bytes;
                                  });
                                }
                                if (!cs.ok() || !put_ok || commit->resp.rejected() > 0) {
                                  Count([](KvStoreClientStats& s) { s.offload_errors++; });
                                }
                                OffloadShardDone(op);
                              });
      };
      if (!st.ok()) {
        send_commit(st, {}, {});
        return;
      }
      // The puts read op->req.data, which op keeps alive until this shard is done.
      batch->Flush(std::max(op->deadline - absl::Now(), absl::Milliseconds(1)),
                   [send_commit, hashes = std::move(hashes), checksums = std::move(checksums)](absl::Status ps) mutable {
                     send_commit(ps, std::move(hashes), std::move(checksums));
                   });
    });
  }
}

void KvStoreClient::OffloadShardDone(const std::shared_ptr<OffloadOp>& op) {
  bool last;
  {
    std::lock_guard<std::mutex> lock(op->mu);
    last = --op->pending == 0;
  }
  if (!last) return;
  offload_bytes_in_flight_.fetch_sub(op->bytes);
  OpDone();
}

}  // namespace tandem::kvstore
