// The prefill side of disaggregation: an engine KvSink that stages each layer's freshly
// computed KV and writes it into the decode replica's reserved blocks through the
// transfer layer while later layers compute, checksumming what it sends.
//
// Staging (a copy out of the engine's cache) is what lets the engine release the
// request's blocks as soon as prefill ends while writes are still in flight, and what
// lets the layers computed before the decode replica accepted this writer (the write gate,
// write_gate.h) wait for it without holding up the engine: their puts are queued only
// once the gate opens, and dropped if it never does.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "services/prefill/kv_destination.h"
#include "services/prefill/outgoing_kv_sink.h"
#include "services/prefill/write_gate.h"
#include "services/worker/kv_checksum.h"
#include "services/worker/kv_transport.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

class TransferKvSink : public OutgoingKvSink {
 public:
  // `destination` must have been checked against the engine's layout (geometry and
  // fingerprint) by the caller. No put is queued before `gate` opened, nor at or after
  // `write_deadline` (kv_write_deadline.h; the session checks it again right before each put).
  TransferKvSink(std::unique_ptr<KvWriteSession> session, const v1::KvDestination& destination,
                 std::chrono::steady_clock::time_point write_deadline, std::shared_ptr<WriteGate> gate);

  void OnLayerKv(const KvSlice& slice) override;
  // Layouts that are not one latent stream: every extent of the sequence at once
  // (KvPool::SequenceExtents), each to its counterpart in the destination's pool.
  bool takes_sequence_kv() const override { return true; }
  void OnSequenceKv(const KvSequenceKv& kv) override;

  // Waits for the gate when puts are held back for it; completes every put queued (also
  // after an error: nothing is left in flight when `done` runs).
  void Flush(std::function<void(absl::Status)> done) override;
  int64_t bytes() const override { return bytes_; }
  uint64_t checksum() const override { return checksum_.Digest(); }
  double transfer_seconds() const override { return transfer_seconds_; }
  v1::KvPath path() const override { return v1::KV_PATH_TRANSFER; }

 private:
  std::unique_ptr<KvWriteSession> session_;
  std::vector<int32_t> block_ids_;
  KvPoolGeometry pool_;  // checked by CheckKvDestination (the caller)
  int64_t num_blocks_, block_size_, entry_dim_;
  KvPool::Geometry stream_pool_;  // the destination's, for OnSequenceKv
  int64_t state_slot_ = -1;
  // Whether anything more may be staged: no error, the deadline not passed, the gate not
  // closed (else error_ says why); *gate_open: whether the gate is open (not just pending).
  bool MayWrite(bool* gate_open);
  // Queues the held-back puts (the gate is open).
  void PutHeld();

  std::chrono::steady_clock::time_point write_deadline_;
  std::shared_ptr<WriteGate> gate_;
  struct HeldPut {
    const void* local;
    size_t length;
    uint64_t offset;
  };
  std::vector<HeldPut> held_;  // staged, not queued yet
  bool queued_any_ = false;
  std::deque<std::vector<float>> staging_;  // stable addresses until Flush completes
  std::deque<std::vector<std::byte>> byte_staging_;  // (OnSequenceKv's)
  KvChecksum checksum_;
  absl::Status error_;
  int64_t bytes_ = 0;
  std::chrono::steady_clock::time_point first_put_;
  bool started_ = false;
  double transfer_seconds_ = 0;
};

}  // namespace tandem
