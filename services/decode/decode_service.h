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
//
// Writers announce themselves (BeginWrites, answered at once, not after the engine's step
// in flight, once the engine recorded them on the live lease, or refused) and say when they are done
// (EndWrites); a lease that ends unused while a writer may still write stays quarantined
// until proof, which a KvWriterProber looks for when the writer's own word does not come
// (engine/runtime/kv_leases.h, docs/architecture.md "KV leases").
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "services/decode/checksum_worker.h"
#include "services/decode/grpc_writer_state_client.h"
#include "services/decode/kv_writer_prober.h"
#include "services/security/channel_factory.h"
#include "services/worker/channel_cache.h"
#include "services/worker/engine_stream_reactor.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class DecodeServiceImpl final : public v1::Decode::CallbackService {
 public:
  // The longest a Reserve may wait for KV room (its wait_ms is capped to this).
  static constexpr int64_t kMaxReserveWaitMs = 120000;

  struct Options {
    int64_t lease_ms = 30000;  // as the engine's lease
    // The engine's GPU pool offered to prefill replicas of this machine
    // (ModelBackend::ShareKvPool).
    std::optional<v1::DeviceKvPool> device_pool;
    // Channels to writers (Prefill.WriterState), with the cluster's credentials.
    security::ChannelFactory channel_factory;
    KvWriterProberOptions prober;
    std::chrono::milliseconds writer_call_timeout{1000};
    std::chrono::milliseconds writer_connect_timeout{500};
    // The engine drafts (EngineOptions::speculative_tokens > 0): a Decode call must carry
    // the prompt's last hidden state (DecodeRequest.mtp_hidden), hidden_size finite values.
    bool needs_mtp_hidden = false;
  };
  // `engine` must outlive the service; `pool_descriptor` is the registered KV pool's
  // descriptor (KvTransport::ExposePool). The service is the engine's quarantine listener
  // until it is destroyed.
  DecodeServiceImpl(Engine* engine, std::string pool_descriptor, Options options);
  ~DecodeServiceImpl() override;

  // This replica's internal address as peers reach it (KvDestination.decode_address): set
  // once the server listens, before it is registered.
  void SetAddress(std::string address);
  // Writers of quarantined leases not yet known to have stopped, by address (/stats).
  std::map<std::string, size_t> QuarantineWriters() const { return prober_.PendingByAddress(); }

  grpc::ServerUnaryReactor* Reserve(grpc::CallbackServerContext* ctx, const v1::ReserveRequest* request,
                                    v1::ReserveResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateResponse>* Decode(grpc::CallbackServerContext* ctx,
                                                         const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* BeginWrites(grpc::CallbackServerContext* ctx, const v1::BeginWritesRequest* request,
                                        v1::BeginWritesResponse* response) override;
  grpc::ServerUnaryReactor* EndWrites(grpc::CallbackServerContext* ctx, const v1::EndWritesRequest* request,
                                      v1::EndWritesResponse* response) override;

 private:
  struct Reservation {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;
    std::chrono::steady_clock::time_point made;
    int32_t state_slot = -1;
  };
  // Layouts that are not one latent stream: what the prefill replica wrote into `r`
  // (KvPool::SequenceExtents over this replica's pool).
  absl::StatusOr<std::vector<KvExtent>> ExtentsOf(const Reservation& r) const;
  // Takes the reservation of `id` out of the map (it is either used or released).
  std::optional<Reservation> Take(const std::string& id);
  // Records a reservation the engine made (and forgets long-expired ones).
  void Remember(const std::string& id, const KvLeases::Reservation& r);
  // Where the prefill replica writes the reservation `r` of lease `id`.
  void FillDestination(const std::string& id, const KvLeases::Reservation& r, v1::KvDestination* d);
  // On the checksum worker: checks the KV that arrived, then hands the request to the
  // engine; the stream behind `handle` attaches (or fails) when the engine answers.
  // `extents`: ExtentsOf(res) for a layout that is not one latent stream (else empty).
  void CheckAndSubmit(std::shared_ptr<const v1::DecodeRequest> r, Reservation res, std::span<const KvExtent> extents,
                      bool device, EngineStreamReactor::Handle handle);

  Engine* engine_;
  std::string pool_descriptor_;
  int64_t lease_ms_;
  const bool needs_mtp_hidden_;
  std::optional<v1::DeviceKvPool> device_pool_;
  std::mutex mu_;
  std::string address_;  // guarded by mu_
  std::map<std::string, Reservation> reservations_;
  ChannelCache writer_channels_;
  GrpcWriterStateClient writer_state_;
  KvWriterProber prober_;
  ChecksumWorker checksum_worker_{2};  // last: joined before the members its tasks use go
};

}  // namespace tandem
