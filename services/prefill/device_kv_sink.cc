#include "services/prefill/device_kv_sink.h"

#include <cstdlib>

namespace tandem {

DeviceKvSink::DeviceKvSink(std::unique_ptr<PeerKvWriter> writer) : writer_(std::move(writer)) {}

void DeviceKvSink::OnLayerKv(const KvSlice&) {
  // The engine only calls this for sinks that want host KV: a call is a broken invariant.
  std::abort();
}

PeerKvWriter* DeviceKvSink::peer_writer() {
  // The engine asks once per layer of each step, right before writing: the first ask is
  // when the first layer's KV is ready.
  if (!started_) {
    first_write_ = std::chrono::steady_clock::now();
    started_ = true;
  }
  return writer_.get();
}

void DeviceKvSink::Flush(std::function<void(absl::Status)> done) {
  if (started_) {
    transfer_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_write_).count();
  }
  done(absl::OkStatus());
}

}  // namespace tandem
