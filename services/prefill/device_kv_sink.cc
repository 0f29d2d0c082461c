#include "services/prefill/device_kv_sink.h"

#include <algorithm>
#include <cstdlib>

#include "services/prefill/kv_write_deadline.h"

namespace tandem {

DeviceKvSink::DeviceKvSink(std::unique_ptr<PeerKvWriter> writer, std::chrono::steady_clock::time_point write_deadline,
                           std::shared_ptr<WriteGate> gate)
    : guard_(std::move(writer), write_deadline, std::move(gate)) {}

absl::Status DeviceKvSink::DeadlineWriter::WriteLayer(int64_t layer, std::span<const int32_t> src_blocks,
                                                      int64_t begin, int64_t end) {
  if (!error_.ok()) return absl::OkStatus();
  if (!open_) {
    // Before the first copy: the decode replica must have recorded this writer. This runs on
    // the engine thread, so the wait is short: a decode replica that has not answered by
    // then (stopped, overloaded) gets no KV from this request (it is retried elsewhere).
    constexpr auto kMaxWait = std::chrono::milliseconds(500);
    absl::Status gate = gate_->Wait(std::min(deadline_, std::chrono::steady_clock::now() + kMaxWait));
    if (!gate.ok()) {
      error_ = gate;
      return absl::OkStatus();
    }
    open_ = true;
  }
  // Checked before each call that enqueues copies into the peer's pool. What was enqueued
  // before runs on the GPU whatever this process does next (a stopped process's queued
  // kernels still complete, within the step). A host thread held up between this check
  // and the enqueue copies later, into blocks that stay quarantined until this replica's
  // EndWrites (sent once the step returned) or its process is provably gone.
  if (std::chrono::steady_clock::now() >= deadline_) {
    error_ = KvWriteDeadlinePassed();
    return absl::OkStatus();
  }
  return inner_->WriteLayer(layer, src_blocks, begin, end);
}

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
  return &guard_;
}

void DeviceKvSink::Flush(std::function<void(absl::Status)> done) {
  if (started_) {
    transfer_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_write_).count();
  }
  done(guard_.error());
}

}  // namespace tandem
