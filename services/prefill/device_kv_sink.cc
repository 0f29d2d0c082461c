#include "services/prefill/device_kv_sink.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "services/prefill/kv_write_deadline.h"

namespace tandem {

DeviceKvSink::DeviceKvSink(std::unique_ptr<PeerKvWriter> writer, const v1::KvDestination& d,
                           std::chrono::steady_clock::time_point write_deadline, std::shared_ptr<WriteGate> gate)
    : guard_(std::move(writer), write_deadline, std::move(gate)),
      destination_{.num_layers = d.num_layers(), .block_size = d.block_size(), .num_blocks = d.num_blocks(),
                   .num_sequence_slots = d.num_state_slots()},
      destination_blocks_(d.block_ids().begin(), d.block_ids().end()),
      destination_state_slot_(d.state_slot()) {}

bool DeviceKvSink::DeadlineWriter::Admit() {
  if (!error_.ok()) return false;
  if (!open_) {
    // Before the first copy: the decode replica must have recorded this writer. This runs on
    // the engine thread, so the wait is short: a decode replica that has not answered by
    // then (stopped, overloaded) gets no KV from this request (it is retried elsewhere).
    constexpr auto kMaxWait = std::chrono::milliseconds(500);
    absl::Status gate = gate_->Wait(std::min(deadline_, std::chrono::steady_clock::now() + kMaxWait));
    if (!gate.ok()) {
      error_ = gate;
      return false;
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
    return false;
  }
  return true;
}

absl::Status DeviceKvSink::DeadlineWriter::WriteLayer(int64_t layer, std::span<const int32_t> src_blocks,
                                                      int64_t begin, int64_t end) {
  if (!Admit()) return absl::OkStatus();
  return inner_->WriteLayer(layer, src_blocks, begin, end);
}

absl::Status DeviceKvSink::DeadlineWriter::WriteRanges(std::span<const KvExtent> src, std::span<const KvExtent> dst) {
  if (!Admit()) return absl::OkStatus();
  return inner_->WriteRanges(src, dst);
}

void DeviceKvSink::OnSequenceKv(const KvSequenceKv& kv) {
  if (!started_) {
    first_write_ = std::chrono::steady_clock::now();
    started_ = true;
  }
  // This pool's ranges (the GPU pool has the host pool's layout, kv.pool) and the same list
  // over the destination's geometry; the writer checks that each pair has one length and
  // layer, and the kernel bounds every range by the pools as mapped.
  absl::StatusOr<std::vector<KvExtent>> src = kv.pool->SequenceExtents(kv.block_table, kv.state_slot, kv.num_tokens);
  absl::StatusOr<std::vector<KvExtent>> dst = KvPool::SequenceExtents(
      kv.pool->streams(), destination_, destination_blocks_, destination_state_slot_, kv.num_tokens);
  if (!src.ok() || !dst.ok()) {
    guard_.Fail(absl::FailedPreconditionError(
        absl::StrCat("the sequence's KV (", kv.num_tokens, " tokens) does not fit the destination's reservation: ",
                     src.ok() ? dst.status().message() : src.status().message())));
    return;
  }
  if (absl::Status st = guard_.WriteRanges(*src, *dst); !st.ok()) guard_.Fail(st);
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
