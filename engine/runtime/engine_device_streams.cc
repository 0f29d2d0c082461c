// A device backend over KV streams other than one latent stream (DeepSeek-V4 on a GPU)
// computes in its own pool, which has the host pool's layout byte for byte. The host pool
// is where the transfer layer and the kvstore read and write, so what leaves the replica
// is copied to it first (a whole sequence when its export ends, a prefix-cache snapshot
// that an export may hand on), and what arrives is copied from it before the sequence's
// first step. Block ids and state slots mean the same in both pools.
#include "engine/runtime/engine.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

// The pool's own ranges (KvPool::BlockImage, StateImage) as offsets from its first byte.
void AppendRanges(KvPool& pool, const std::vector<std::span<std::byte>>& spans, std::vector<KvExtent>* out) {
  const std::byte* base = pool.memory().data();
  for (const std::span<std::byte>& s : spans) {
    out->push_back({.layer = 0, .offset = static_cast<size_t>(s.data() - base), .bytes = s.size()});
  }
}

}  // namespace

absl::Status Engine::ExportedSequencesToHost(const StepPlan& plan) {
  if (!device_streams_) return absl::OkStatus();
  for (const ScheduledChunk& c : plan.chunks) {
    const Sequence& s = *c.seq;
    // (A sink that writes device to device reads the GPU pool itself.)
    if (s.kv_sink == nullptr || !s.kv_sink->wants_host_kv() || !c.reaches_end()) continue;
    absl::StatusOr<std::vector<KvExtent>> ranges = pool_->SequenceExtents(s.blocks, s.state_slot, c.start + c.num_tokens);
    if (!ranges.ok()) return ranges.status();
    if (absl::Status st = backend_->PoolRangesToHost(*ranges, *pool_); !st.ok()) return st;
    counters_.kv_host_staged_bytes += static_cast<int64_t>(KvExtentsBytes(*ranges));
  }
  return absl::OkStatus();
}

absl::Status Engine::SequenceFromHost(const Sequence& s, int64_t num_tokens) {
  absl::StatusOr<std::vector<KvExtent>> ranges = pool_->SequenceExtents(s.blocks, s.state_slot, num_tokens);
  if (!ranges.ok()) return ranges.status();
  counters_.kv_host_staged_bytes += static_cast<int64_t>(KvExtentsBytes(*ranges));
  return backend_->PoolRangesFromHost(*ranges, *pool_);
}

absl::Status Engine::ImportedPrefixToDevice(const Sequence& s) {
  std::vector<KvExtent> ranges;
  for (int32_t b = s.import_begin; b < s.import_end; ++b) {
    AppendRanges(*pool_, pool_->BlockImage(s.blocks[static_cast<size_t>(b)]), &ranges);
  }
  AppendRanges(*pool_, pool_->StateImage(s.state_slot), &ranges);
  return backend_->PoolRangesFromHost(ranges, *pool_);
}

void Engine::CopyStateSlot(int64_t from, int64_t to, bool to_host) {
  pool_->CopySequenceSlot(from, to);
  if (!device_streams_) return;
  // Between two valid slots of one allocation: a failure is the device's, not the request's.
  absl::Status st = backend_->CopyStateSlot(from, to);
  if (st.ok() && to_host) {
    std::vector<KvExtent> ranges;
    AppendRanges(*pool_, pool_->StateImage(to), &ranges);
    st = backend_->PoolRangesToHost(ranges, *pool_);
  }
  TANDEM_CHECK(st.ok()) << "copying state slot " << from << " to " << to << " on " << backend_->device_name() << ": "
                        << st;
}

}  // namespace tandem
