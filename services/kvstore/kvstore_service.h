// tandem.v1.KvStore (kvstore.proto) over a BlockStore: the control plane in gRPC, the
// block bytes over the transfer layer (UCX between processes). Writers put straight into
// the slots Reserve hands out (the BlockStore's memory is a region of the transfer
// engine); for Get, this instance puts the blocks into the reader's region, then
// answers. Gets run on one I/O thread of their own (they may read the SSD tier), never
// on gRPC's threads, and complete on the transfer layer's thread.
//
// Every RPC goes through one decorator (Call in the .cc): it decodes the request itself
// (the methods are registered raw, so that an undecodable message is INVALID_ARGUMENT
// naming its type, where gRPC's generated handlers would answer UNIMPLEMENTED), times
// the call, counts its outcome (KvStoreRpcMetrics, when given) and logs it with the
// caller's request id (gRPC metadata x-request-id, which the prefill replicas' client
// sends): at debug level when it succeeds, at info when it fails, so that one request
// can be followed from the router through prefill into the kvstore's log.
//
// Bounded work per call (kvstore_limits.h): more than max_hashes_per_call hashes is
// INVALID_ARGUMENT; a Get arriving while max_queued_gets wait for the I/O thread is
// RESOURCE_EXHAUSTED; a Get whose deadline passed while it waited is DEADLINE_EXCEEDED
// without touching the store.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "nlohmann/json_fwd.hpp"
#include "services/common/transfer/transfer_engine.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/kvstore_limits.h"
#include "tandem/v1/kvstore.grpc.pb.h"

namespace tandem::kvstore {

class KvStoreRpcMetrics;

struct KvStoreServiceOptions {
  std::string instance_name;
  uint64_t layout_fingerprint = 0;  // requests for another layout: FAILED_PRECONDITION
  int64_t lease_ms = 30000;         // told to writers (the BlockStore enforces it)
  absl::Duration get_timeout = absl::Seconds(10);  // a Get's puts, at most (and the call's deadline)
  KvStoreRpcMetrics* metrics = nullptr;            // may be null; must outlive the service
  int max_hashes_per_call = kMaxHashesPerCall;     // per Lookup, Reserve, Commit, Get
  int max_queued_gets = kMaxQueuedGets;            // Gets waiting for the I/O thread
};

// Every method raw (ByteBuffer in and out): the service decodes requests itself.
using KvStoreRawService = v1::KvStore::WithRawCallbackMethod_Lookup<v1::KvStore::WithRawCallbackMethod_Reserve<
    v1::KvStore::WithRawCallbackMethod_Commit<v1::KvStore::WithRawCallbackMethod_Get<
        v1::KvStore::WithRawCallbackMethod_Stats<v1::KvStore::Service>>>>>;

class KvStoreServiceImpl final : public KvStoreRawService {
 public:
  // `store` and `transfer` must outlive the service; `region_descriptor` is the serialized
  // descriptor of the store's memory (what writers put into).
  KvStoreServiceImpl(BlockStore* store, transfer::TransferEngine* transfer, std::string region_descriptor,
                     KvStoreServiceOptions options);
  // Stops the I/O thread; call Drain first.
  ~KvStoreServiceImpl() override;

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

  // The name Stats reports (known once the server has its address).
  void SetInstanceName(std::string name);

  // Waits (up to `timeout`) until no Get is in flight. Returns whether none is.
  bool Drain(absl::Duration timeout);

 private:
  absl::Status CheckFormat(const v1::KvBlockFormat& f) const;
  absl::Status CheckHashCount(int n) const;
  template <typename Request, typename Response>
  class Call;
  using GetCall = Call<v1::KvGetRequest, v1::KvGetResponse>;
  void RunGet(std::shared_ptr<GetCall> call, absl::Time deadline);
  void GetDone();
  void IoLoop();

  BlockStore* store_;
  transfer::TransferEngine* transfer_;
  std::string region_descriptor_;
  KvStoreServiceOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> io_queue_;
  int64_t gets_in_flight_ = 0;
  bool stop_ = false;
  std::thread io_thread_;
};

void ToProto(const KvStoreStats& s, v1::KvStatsResponse* out);
nlohmann::json StatsJson(const KvStoreStats& s, const std::string& instance_name);

}  // namespace tandem::kvstore
