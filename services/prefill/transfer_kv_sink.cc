#include "services/prefill/transfer_kv_sink.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/prefill/kv_destination.h"
#include "services/prefill/kv_write_deadline.h"
#include "kernels/common/check.h"

namespace tandem {

TransferKvSink::TransferKvSink(std::unique_ptr<KvWriteSession> session, const v1::KvDestination& d,
                               std::chrono::steady_clock::time_point write_deadline, std::shared_ptr<WriteGate> gate)
    : session_(std::move(session)),
      block_ids_(d.block_ids().begin(), d.block_ids().end()),
      pool_{.num_layers = d.num_layers(), .num_blocks = d.num_blocks(), .block_size = d.block_size(),
            .entry_dim = d.entry_dim(), .bytes_per_value = static_cast<int64_t>(sizeof(float))},
      num_blocks_(d.num_blocks()),
      block_size_(d.block_size()),
      entry_dim_(d.entry_dim()),
      stream_pool_{.num_layers = d.num_layers(), .block_size = d.block_size(), .num_blocks = d.num_blocks(),
                   .num_sequence_slots = d.num_state_slots()},
      state_slot_(d.state_slot()),
      write_deadline_(write_deadline),
      gate_(std::move(gate)),
      checksum_(d.num_layers()) {}

void TransferKvSink::OnLayerKv(const KvSlice& s) {
  if (!error_.ok() || s.end <= s.begin) return;
  if (s.entry_dim != entry_dim_ || s.end > static_cast<int64_t>(block_ids_.size()) * block_size_) {
    error_ = absl::FailedPreconditionError(absl::StrCat("KV slice [", s.begin, ", ", s.end,
                                                        ") does not fit the destination's reservation"));
    return;
  }
  bool gate_open = false;
  if (!MayWrite(&gate_open)) return;
  // Stage the slice contiguously, then one write per run of positions within a block.
  std::vector<float>& stage = staging_.emplace_back(static_cast<size_t>((s.end - s.begin) * entry_dim_));
  for (int64_t p = s.begin; p < s.end; ++p) {
    std::memcpy(&stage[(p - s.begin) * entry_dim_], s.Entry(p), entry_dim_ * sizeof(float));
  }
  checksum_.Update(s.layer, stage.data(), stage.size() * sizeof(float));
  for (int64_t p = s.begin; p < s.end;) {
    const int64_t slot = p % block_size_;
    const int64_t n = std::min(block_size_ - slot, s.end - p);
    const int64_t block = block_ids_[p / block_size_];
    const uint64_t offset = KvEntryOffset(pool_, s.layer, block, slot);
    const size_t length = static_cast<size_t>(n * entry_dim_) * sizeof(float);
    held_.push_back({&stage[(p - s.begin) * entry_dim_], length, offset});
    bytes_ += static_cast<int64_t>(length);
    p += n;
  }
  if (gate_open) PutHeld();  // open: this layer moves while the next one computes
}

bool TransferKvSink::MayWrite(bool* gate_open) {
  if (!error_.ok()) return false;
  if (std::chrono::steady_clock::now() >= write_deadline_) {
    error_ = KvWriteDeadlinePassed();  // the lease may end before these puts land
    return false;
  }
  const std::optional<absl::Status> gate = gate_->state();
  if (gate && !gate->ok()) {
    error_ = *gate;  // the decode replica did not record this writer: nothing may be written
    return false;
  }
  *gate_open = gate.has_value();  // (read once: what is staged now goes out now only if open)
  return true;
}

void TransferKvSink::OnSequenceKv(const KvSequenceKv& kv) {
  bool gate_open = false;
  if (!MayWrite(&gate_open)) return;
  absl::StatusOr<std::vector<KvExtent>> src = kv.pool->SequenceExtents(kv.block_table, kv.state_slot, kv.num_tokens);
  absl::StatusOr<std::vector<KvExtent>> dst =
      KvPool::SequenceExtents(kv.pool->streams(), stream_pool_, block_ids_, state_slot_, kv.num_tokens);
  if (!src.ok() || !dst.ok() || src->size() != dst->size()) {
    error_ = absl::FailedPreconditionError(absl::StrCat(
        "the sequence's KV (", kv.num_tokens, " tokens) does not fit the destination's reservation: ",
        src.ok() ? dst.status().ToString() : src.status().ToString()));
    return;
  }
  std::vector<std::byte>& stage = byte_staging_.emplace_back(KvExtentsBytes(*src));
  const std::byte* base = kv.pool->memory().data();
  size_t at = 0;
  for (size_t i = 0; i < src->size(); ++i) {
    const KvExtent& s = (*src)[i];
    TANDEM_CHECK_EQ(s.bytes, (*dst)[i].bytes);  // one layout on both ends (the fingerprint)
    std::memcpy(stage.data() + at, base + s.offset, s.bytes);
    checksum_.Update(s.layer, stage.data() + at, s.bytes);
    held_.push_back({stage.data() + at, s.bytes, (*dst)[i].offset});
    bytes_ += static_cast<int64_t>(s.bytes);
    at += s.bytes;
  }
  if (gate_open) PutHeld();
}

void TransferKvSink::PutHeld() {
  if (held_.empty() || !error_.ok()) return;
  if (!started_) {
    first_put_ = std::chrono::steady_clock::now();
    started_ = true;
  }
  for (const HeldPut& h : held_) {
    absl::Status st = session_->Put(h.local, h.length, h.offset);
    if (!st.ok()) {
      error_ = st;
      break;
    }
    queued_any_ = true;
  }
  held_.clear();
  session_->Commit();
}

void TransferKvSink::Flush(std::function<void(absl::Status)> done) {
  auto complete = [this, done = std::move(done)](const absl::Status& gate) mutable {
    if (!gate.ok() && error_.ok()) error_ = gate;
    if (gate.ok()) PutHeld();
    held_.clear();
    if (!queued_any_) {
      done(error_);
      return;
    }
    // Whatever went wrong, the puts already queued complete before `done`: the caller
    // tells the decode replica its writes ended once it runs.
    session_->Flush([this, done = std::move(done)](absl::Status st) {
      if (started_) {
        transfer_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_put_).count();
      }
      done(error_.ok() ? st : error_);
    });
  };
  if (held_.empty()) {
    // Nothing waits for the gate: what was queued only needs completing.
    const std::optional<absl::Status> gate = gate_->state();
    complete(gate && !gate->ok() ? *gate : absl::OkStatus());
    return;
  }
  gate_->OnResolved(std::move(complete));
}

}  // namespace tandem
