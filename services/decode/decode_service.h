// tandem.v1.Decode on a local engine: reserves KV blocks under a lease for the prefill
// replica to write into (its host pool over the transfer layer, or its GPU pool device to
// device), checks what arrived (size and checksum, in the pool the KV went to), then
// decodes and streams the tokens after the first.
//
// No gRPC callback thread waits on the engine: Reserve is answered from the engine
// thread when the reservation is made (a full pool: the Reserve waits up to its wait_ms
// in the engine's FIFO of waiting reservations, and is answered as blocks free), and
// Decode's checksum runs on a checksum worker, which hands the request to the engine
// asynchronously; the stream attaches when the engine has admitted it.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "services/decode/checksum_worker.h"
#include "services/worker/engine_stream_reactor.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class DecodeServiceImpl final : public v1::Decode::CallbackService {
 public:
  // The longest a Reserve may wait for KV room (its wait_ms is capped to this).
  static constexpr int64_t kMaxReserveWaitMs = 120000;

  // `engine` must outlive the service; `pool_descriptor` is the registered KV pool's
  // descriptor (KvTransport::ExposePool); `lease_ms` as the engine's lease; `device_pool`,
  // when set, the engine's GPU pool offered to prefill replicas of this machine
  // (ModelBackend::ShareKvPool).
  DecodeServiceImpl(Engine* engine, std::string pool_descriptor, int64_t lease_ms,
                    std::optional<v1::DeviceKvPool> device_pool = std::nullopt);

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* ctx, const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Decode(grpc::CallbackServerContext* ctx,
                                                         const v1::DecodeRequest* request) override;

 private:
  struct Reservation {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;
    std::chrono::steady_clock::time_point made;
  };
  // Takes the reservation of `id` out of the map (it is either used or released).
  std::optional<Reservation> Take(const std::string& id);
  // Records a reservation the engine made (and forgets long-expired ones).
  void Remember(const std::string& id, const std::vector<int32_t>& blocks, int32_t num_tokens);
  // Where the prefill replica writes the reservation `blocks` of lease `id`.
  void FillDestination(const std::string& id, const std::vector<int32_t>& blocks, v1::KvDestination* d) const;
  // On the checksum worker: checks the KV that arrived, then hands the request to the
  // engine; the stream behind `handle` attaches (or fails) when the engine answers.
  void CheckAndSubmit(std::shared_ptr<const v1::DecodeRequest> r, Reservation res, bool device,
                      EngineStreamReactor::Handle handle);

  Engine* engine_;
  std::string pool_descriptor_;
  int64_t lease_ms_;
  std::optional<v1::DeviceKvPool> device_pool_;
  std::mutex mu_;
  std::map<std::string, Reservation> reservations_;
  ChecksumWorker checksum_worker_{2};  // last: joined before the members its tasks use go
};

}  // namespace tandem
