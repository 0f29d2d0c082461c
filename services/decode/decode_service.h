// tandem.v1.Decode on a local engine: reserves KV blocks under a lease for the prefill
// replica to write into (its host pool over the transfer layer, or its GPU pool device to
// device), checks what arrived (size and checksum, in the pool the KV went to), then
// decodes and streams the tokens after the first.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class DecodeServiceImpl final : public v1::Decode::CallbackService {
 public:
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

  Engine* engine_;
  std::string pool_descriptor_;
  int64_t lease_ms_;
  std::optional<v1::DeviceKvPool> device_pool_;
  std::mutex mu_;
  std::map<std::string, Reservation> reservations_;
};

}  // namespace tandem
