#include "services/prefill/prefix_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/runtime/block_hash.h"

namespace tandem {

OffloadKvSink::OffloadKvSink(KvSink* inner, int32_t first_block, int32_t end_block, int64_t num_layers,
                             int64_t block_size, int64_t entry_dim)
    : inner_(inner),
      first_block_(first_block),
      end_block_(end_block),
      num_layers_(num_layers),
      block_size_(block_size),
      entry_dim_(entry_dim) {
  const int64_t blocks = std::max(0, end_block_ - first_block_);
  data_.resize(static_cast<size_t>(blocks * num_layers_ * block_size_ * entry_dim_));
  expected_ = blocks * num_layers_ * block_size_;
}

void OffloadKvSink::OnLayerKv(const KvSlice& s) {
  if (inner_ != nullptr && inner_->wants_host_kv()) inner_->OnLayerKv(s);
  if (s.entry_dim != entry_dim_ || s.layer < 0 || s.layer >= num_layers_) return;
  const int64_t begin = std::max(s.begin, static_cast<int64_t>(first_block_) * block_size_);
  const int64_t end = std::min(s.end, static_cast<int64_t>(end_block_) * block_size_);
  for (int64_t p = begin; p < end; ++p) {
    const int64_t block = p / block_size_ - first_block_;
    float* dst = data_.data() + ((block * num_layers_ + s.layer) * block_size_ + p % block_size_) * entry_dim_;
    std::memcpy(dst, s.Entry(p), static_cast<size_t>(entry_dim_) * sizeof(float));
    ++copied_;
  }
}

OffloadSequenceKvSink::OffloadSequenceKvSink(KvSink* inner, int32_t first_block, int32_t end_block,
                                             int64_t block_bytes, int64_t state_bytes)
    : inner_(inner),
      first_block_(first_block),
      end_block_(end_block),
      block_bytes_(block_bytes),
      state_bytes_(state_bytes),
      state_chunks_(static_cast<int32_t>((state_bytes + block_bytes - 1) / block_bytes)) {}

void OffloadSequenceKvSink::OnSequenceKv(const KvSequenceKv& kv) {
  if (inner_ != nullptr) inner_->OnSequenceKv(kv);
  const int64_t bs = kv.pool->geometry().block_size;
  if (kv.snapshot_slot < 0 || kv.snapshot_tokens != end_block_ * bs || end_block_ < first_block_ ||
      static_cast<int64_t>(kv.block_table.size()) < end_block_ || kv.pool->BlockImageBytes() != block_bytes_ ||
      kv.pool->StateImageBytes() != state_bytes_) {
    return;
  }
  const int64_t blocks = end_block_ - first_block_;
  data_.assign(static_cast<size_t>((blocks + state_chunks_) * block_bytes_) / sizeof(float), 0.0f);
  auto* out = reinterpret_cast<std::byte*>(data_.data());
  for (int64_t b = 0; b < blocks; ++b) {
    const std::span<std::byte> to[] = {std::span<std::byte>(out + b * block_bytes_, static_cast<size_t>(block_bytes_))};
    CopyConcatenated(ReadOnly(kv.pool->BlockImage(kv.block_table[static_cast<size_t>(first_block_ + b)])), to);
  }
  const std::span<std::byte> state[] = {
      std::span<std::byte>(out + blocks * block_bytes_, static_cast<size_t>(state_bytes_))};
  CopyConcatenated(ReadOnly(kv.pool->StateImage(kv.snapshot_slot)), state);
  complete_ = true;
}

PrefixTierSession::PrefixTierSession(PrefixStore* store, const Engine& engine, const std::vector<int32_t>& prompt,
                                     int64_t max_offload_bytes)
    : store_(store) {
  const Engine::KvMemory m = engine.kv_memory();
  num_layers_ = m.num_layers;
  block_size_ = m.block_size;
  entry_dim_ = m.entry_dim;
  block_bytes_ = PagedBytesPerBlock(engine.kv_layout().streams, static_cast<int32_t>(block_size_));
  state_bytes_ = SequenceStateBytes(engine.kv_layout().streams);
  max_offload_blocks_ = std::max<int64_t>(1, max_offload_bytes / block_bytes_);
  hashes_ = HashFullBlocks(prompt, static_cast<int32_t>(block_size_), engine.layout_fingerprint());
  usable_ = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(hashes_.size()),
                                                   (static_cast<int64_t>(prompt.size()) - 1) / block_size_));
  const std::span<const uint64_t> usable(hashes_.data(), static_cast<size_t>(usable_));
  local_ = engine.CachedPrefixLength(usable);
  local_state_ = state_bytes_ > 0 ? engine.CachedStatePrefixLength(usable) : local_;
}

void PrefixTierSession::Fetch(std::function<void()> then) {
  if (hashes_.empty()) {
    then();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  store_->Fetch({.hashes = hashes_,
                 .first_block = local_,
                 .end_block = usable_,
                 .min_state_end = local_state_,
                 .request_id = request_id_},
                [this, start, then = std::move(then)](PrefixStore::FetchResult r) {
                  result_ = std::move(r);
                  fetch_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                  then();
                });
}

KvSink* PrefixTierSession::Wrap(KvSink* inner) {
  if (state_bytes_ > 0) {
    // The blocks up to the last full one before the prompt's last token and the state
    // there (the engine's snapshot), unless the tier has both.
    if (!result_.available || usable_ < 1) return inner;
    if (result_.stored_prefix >= usable_ && result_.stored_state_end == usable_) return inner;
    const int32_t first = std::min(result_.stored_prefix, usable_);
    const int64_t chunks = (state_bytes_ + block_bytes_ - 1) / block_bytes_;
    if (usable_ - first + chunks > max_offload_blocks_) return inner;
    offload_sequence_ = std::make_unique<OffloadSequenceKvSink>(inner, first, usable_, block_bytes_, state_bytes_);
    return offload_sequence_.get();
  }
  const int32_t full = static_cast<int32_t>(hashes_.size());
  if (!result_.available || result_.stored_prefix >= full) return inner;
  const int32_t first = std::max(result_.stored_prefix, 0);
  const int32_t end = static_cast<int32_t>(std::min<int64_t>(full, first + max_offload_blocks_));
  offload_ = std::make_unique<OffloadKvSink>(inner, first, end, num_layers_, block_size_, entry_dim_);
  return offload_.get();
}

void PrefixTierSession::Offload() {
  if (offload_sequence_ != nullptr) {
    OffloadSequenceKvSink& o = *offload_sequence_;
    if (!o.complete()) return;
    PrefixStore::OffloadRequest r;
    r.hashes.assign(hashes_.begin() + o.first_block(), hashes_.begin() + o.end_block());
    const uint64_t at = hashes_[static_cast<size_t>(o.end_block()) - 1];
    for (int32_t i = 0; i < o.state_chunks(); ++i) r.hashes.push_back(StateChunkHash(at, static_cast<uint32_t>(i)));
    r.data = o.TakeData();
    r.request_id = request_id_;
    store_->Offload(std::move(r));
    return;
  }
  if (!offload_ || !offload_->complete() || offload_->end_block() <= offload_->first_block()) return;
  PrefixStore::OffloadRequest r;
  r.hashes.assign(hashes_.begin() + offload_->first_block(), hashes_.begin() + offload_->end_block());
  r.data = offload_->TakeData();
  r.request_id = request_id_;
  store_->Offload(std::move(r));
}

}  // namespace tandem
