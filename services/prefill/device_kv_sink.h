// The prefill side of the device-to-device KV path (CUDA IPC): the engine hands each
// layer's new positions to the backend's PeerKvWriter, which copies them on the GPU into
// the decode replica's device pool while later layers compute. Nothing is staged on the
// host; the writes are complete when the engine's step returns, so Flush has nothing
// left to wait for. The copies read the engine's own blocks, which cannot wait for the
// decode replica to accept this writer (write_gate.h): the first copy waits for the gate
// on the engine thread instead (500 ms at most), which the BeginWrites sent when the call
// arrived has nearly always answered by the time the first layer is computed.
//
// Layouts other than one latent stream (DeepSeek-V4) move whole sequences: once the
// prompt's last token is computed the engine calls OnSequenceKv, and the writer copies
// the sequence's ranges of the GPU pool (KvPool::SequenceExtents) to the same list of
// ranges in the decode replica's pool, laid out by the destination's geometry.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/kv_pool.h"
#include "engine/model/model_backend.h"
#include "services/prefill/outgoing_kv_sink.h"
#include "services/prefill/write_gate.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

class DeviceKvSink : public OutgoingKvSink {
 public:
  // No copy is enqueued before `gate` opened (a gate that shuts, or stays closed until
  // `write_deadline`, skips every layer), nor at or after `write_deadline`
  // (kv_write_deadline.h): the layers after it are skipped and Flush reports the error.
  // `d`: the decode replica's reservation (its pool's geometry, blocks and state slot:
  // where a whole sequence's ranges go).
  DeviceKvSink(std::unique_ptr<PeerKvWriter> writer, const v1::KvDestination& d,
               std::chrono::steady_clock::time_point write_deadline, std::shared_ptr<WriteGate> gate);

  void OnLayerKv(const KvSlice& slice) override;  // never called: wants_host_kv() is false
  PeerKvWriter* peer_writer() override;
  bool wants_host_kv() const override { return false; }
  bool takes_sequence_kv() const override { return guard_.writes_ranges(); }
  void OnSequenceKv(const KvSequenceKv& kv) override;

  void Flush(std::function<void(absl::Status)> done) override;
  int64_t bytes() const override { return guard_.bytes(); }
  uint64_t checksum() const override { return guard_.checksum(); }
  double transfer_seconds() const override { return transfer_seconds_; }
  v1::KvPath path() const override { return v1::KV_PATH_CUDA_IPC; }

 private:
  // The backend's writer behind the deadline check, which runs before every WriteLayer
  // (the call that enqueues the copies). A failed check is not a failed step: the other
  // requests of the step go on; this one's Flush fails.
  class DeadlineWriter : public PeerKvWriter {
   public:
    DeadlineWriter(std::unique_ptr<PeerKvWriter> inner, std::chrono::steady_clock::time_point deadline,
                   std::shared_ptr<WriteGate> gate)
        : inner_(std::move(inner)), deadline_(deadline), gate_(std::move(gate)) {}
    absl::Status WriteLayer(int64_t layer, std::span<const int32_t> src_blocks, int64_t begin,
                            int64_t end) override;
    bool writes_ranges() const override { return inner_->writes_ranges(); }
    absl::Status WriteRanges(std::span<const KvExtent> src, std::span<const KvExtent> dst) override;
    void Fail(absl::Status st) {
      if (error_.ok()) error_ = std::move(st);
    }
    int64_t bytes() const override { return inner_->bytes(); }
    uint64_t checksum() const override { return inner_->checksum(); }
    std::string path() const override { return inner_->path(); }
    const absl::Status& error() const { return error_; }

   private:
    // Whether copies may be enqueued now: the gate open (waited for once), the deadline
    // not passed; otherwise error_ says why.
    bool Admit();
    std::unique_ptr<PeerKvWriter> inner_;
    std::chrono::steady_clock::time_point deadline_;
    std::shared_ptr<WriteGate> gate_;
    bool open_ = false;
    absl::Status error_;
  };
  DeadlineWriter guard_;
  const KvPool::Geometry destination_;
  const std::vector<int32_t> destination_blocks_;
  const int32_t destination_state_slot_;
  std::chrono::steady_clock::time_point first_write_;
  bool started_ = false;
  double transfer_seconds_ = 0;
};

}  // namespace tandem
