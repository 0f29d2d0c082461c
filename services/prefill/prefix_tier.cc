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

PrefixTierSession::PrefixTierSession(PrefixStore* store, const Engine& engine, const std::vector<int32_t>& prompt,
                                     int64_t max_offload_bytes)
    : store_(store) {
  const Engine::KvMemory m = engine.kv_memory();
  num_layers_ = m.num_layers;
  block_size_ = m.block_size;
  entry_dim_ = m.entry_dim;
  const int64_t block_bytes = num_layers_ * block_size_ * entry_dim_ * static_cast<int64_t>(sizeof(float));
  max_offload_blocks_ = std::max<int64_t>(1, max_offload_bytes / block_bytes);
  hashes_ = HashFullBlocks(prompt, static_cast<int32_t>(block_size_), engine.layout_fingerprint());
  usable_ = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(hashes_.size()),
                                                   (static_cast<int64_t>(prompt.size()) - 1) / block_size_));
  local_ = engine.CachedPrefixLength(std::span<const uint64_t>(hashes_.data(), static_cast<size_t>(usable_)));
}

void PrefixTierSession::Fetch(std::function<void()> then) {
  if (hashes_.empty()) {
    then();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  store_->Fetch({.hashes = hashes_, .first_block = local_, .end_block = usable_, .request_id = request_id_},
                [this, start, then = std::move(then)](PrefixStore::FetchResult r) {
                  result_ = std::move(r);
                  fetch_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                  then();
                });
}

KvSink* PrefixTierSession::Wrap(KvSink* inner) {
  const int32_t full = static_cast<int32_t>(hashes_.size());
  if (!result_.available || result_.stored_prefix >= full) return inner;
  const int32_t first = std::max(result_.stored_prefix, 0);
  const int32_t end = static_cast<int32_t>(std::min<int64_t>(full, first + max_offload_blocks_));
  offload_ = std::make_unique<OffloadKvSink>(inner, first, end, num_layers_, block_size_, entry_dim_);
  return offload_.get();
}

void PrefixTierSession::Offload() {
  if (!offload_ || !offload_->complete() || offload_->end_block() <= offload_->first_block()) return;
  PrefixStore::OffloadRequest r;
  r.hashes.assign(hashes_.begin() + offload_->first_block(), hashes_.begin() + offload_->end_block());
  r.data = offload_->TakeData();
  r.request_id = request_id_;
  store_->Offload(std::move(r));
}

}  // namespace tandem
