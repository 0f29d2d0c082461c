// The prefill side of the device-to-device KV path (CUDA IPC): the engine hands each
// layer's new positions to the backend's PeerKvWriter, which copies them on the GPU into
// the decode replica's device pool while later layers compute. Nothing is staged on the
// host; the writes are complete when the engine's step returns, so Flush has nothing
// left to wait for.
#pragma once

#include <chrono>
#include <memory>

#include "engine/model/model_backend.h"
#include "services/prefill/outgoing_kv_sink.h"

namespace tandem {

class DeviceKvSink : public OutgoingKvSink {
 public:
  explicit DeviceKvSink(std::unique_ptr<PeerKvWriter> writer);

  void OnLayerKv(const KvSlice& slice) override;  // never called: wants_host_kv() is false
  PeerKvWriter* peer_writer() override;
  bool wants_host_kv() const override { return false; }

  void Flush(std::function<void(absl::Status)> done) override;
  int64_t bytes() const override { return writer_->bytes(); }
  uint64_t checksum() const override { return writer_->checksum(); }
  double transfer_seconds() const override { return transfer_seconds_; }
  v1::KvPath path() const override { return v1::KV_PATH_CUDA_IPC; }

 private:
  std::unique_ptr<PeerKvWriter> writer_;
  std::chrono::steady_clock::time_point first_write_;
  bool started_ = false;
  double transfer_seconds_ = 0;
};

}  // namespace tandem
