// The prefill replica's side of the kvstore tier, for one request (docs/design.md §3 step 4):
//
//   1. before computing: the prompt's full-block hash chain; how much of it the engine's
//      own prefix cache holds (Engine::CachedPrefixLength, a hint); then, asynchronously,
//      how much the tier holds and the KV of the blocks after the local ones (PrefixStore
//      ::Fetch). The engine thread never waits on this: the request is submitted once the
//      fetch is done, with the fetched blocks as its EngineRequest::prefix_kv, and other
//      requests keep computing meanwhile;
//   2. while computing: the engine's KvSink for the request is wrapped so that the KV of
//      the prompt's full blocks the tier lacks is also collected (OffloadKvSink; for a
//      layout with per-sequence state, OffloadSequenceKvSink, which also collects the
//      state where the last of those blocks ends);
//   3. after the response: those blocks go to the tier in the background (Offload).
//
// Nothing here can fail a request or change its output: a tier that is missing, slow,
// full or down gives no prefix (the engine computes everything) and takes no offload.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "engine/runtime/kv_sink.h"
#include "services/kvstore/prefix_store.h"

namespace tandem {

// A KvSink that passes everything to `inner` and also copies the KV of prompt blocks
// [first_block, end_block) into one buffer in the PrefixStore layout (block-major, then
// layer, slot, entry), for an offload once the request is done.
class OffloadKvSink : public KvSink {
 public:
  OffloadKvSink(KvSink* inner, int32_t first_block, int32_t end_block, int64_t num_layers, int64_t block_size,
                int64_t entry_dim);

  void OnLayerKv(const KvSlice& slice) override;
  // The inner sink's device writer, if it has one: the engine then writes device to device
  // for the inner sink and still hands this one the host entries it collects.
  PeerKvWriter* peer_writer() override { return inner_ != nullptr ? inner_->peer_writer() : nullptr; }

  // Every entry of the blocks arrived (each position of each layer exactly once).
  bool complete() const { return copied_ == expected_; }
  int32_t first_block() const { return first_block_; }
  int32_t end_block() const { return end_block_; }
  // The collected blocks; call once, after the request ended.
  std::vector<float> TakeData() { return std::move(data_); }

 private:
  KvSink* inner_;
  int32_t first_block_, end_block_;
  int64_t num_layers_, block_size_, entry_dim_;
  std::vector<float> data_;
  int64_t copied_ = 0;  // entries
  int64_t expected_ = 0;
};

// The same for a layout with per-sequence streams (DeepSeek-V4), whose KV is handed over
// once per request (KvSink::OnSequenceKv): the block images of prompt blocks
// [first_block, end_block) and the image of the state snapshot where end_block ends, in
// the store's layout (blocks back to back, then the state in block-sized chunks, the last
// one zero-padded). Nothing is collected when the engine kept no snapshot there.
class OffloadSequenceKvSink : public KvSink {
 public:
  OffloadSequenceKvSink(KvSink* inner, int32_t first_block, int32_t end_block, int64_t block_bytes,
                        int64_t state_bytes);

  void OnLayerKv(const KvSlice& slice) override {
    if (inner_ != nullptr) inner_->OnLayerKv(slice);
  }
  PeerKvWriter* peer_writer() override { return inner_ != nullptr ? inner_->peer_writer() : nullptr; }
  // OnSequenceKv reads the host pool's blocks, whatever the inner sink reads.
  bool wants_host_kv() const override { return true; }
  bool takes_sequence_kv() const override { return true; }
  void OnSequenceKv(const KvSequenceKv& kv) override;

  bool complete() const { return complete_; }
  int32_t first_block() const { return first_block_; }
  int32_t end_block() const { return end_block_; }
  int32_t state_chunks() const { return state_chunks_; }
  std::vector<float> TakeData() { return std::move(data_); }

 private:
  KvSink* inner_;
  int32_t first_block_, end_block_;
  int64_t block_bytes_, state_bytes_;
  int32_t state_chunks_;
  std::vector<float> data_;
  bool complete_ = false;
};

class PrefixTierSession {
 public:
  // `store` must outlive the session. `max_offload_bytes` caps what one request offloads
  // (its leading blocks).
  PrefixTierSession(PrefixStore* store, const Engine& engine, const std::vector<int32_t>& prompt,
                    int64_t max_offload_bytes = int64_t{512} << 20);

  // The request the session serves: sent along to the tier, for its logs.
  void set_request_id(std::string id) { request_id_ = std::move(id); }

  // Step 1. `then` runs exactly once, on any thread (possibly inside this call).
  void Fetch(std::function<void()> then);
  // The fetched prefix for EngineRequest::prefix_kv (null: none). After Fetch's `then`.
  std::shared_ptr<const PrefixKv> prefix() const { return result_.prefix; }
  // Step 2: the sink the engine should use instead of `inner` (which it wraps), or
  // `inner` itself when there is nothing to offload. After Fetch's `then`.
  KvSink* Wrap(KvSink* inner);
  // Step 3: after the request's final output, when it succeeded.
  void Offload();

  int32_t local_blocks() const { return local_; }
  const PrefixStore::FetchResult& result() const { return result_; }
  // How long the tier took to answer Fetch (after Fetch's `then`).
  double fetch_seconds() const { return fetch_seconds_; }

 private:
  PrefixStore* store_;
  std::string request_id_;
  std::vector<uint64_t> hashes_;  // the prompt's full blocks
  int32_t usable_ = 0;            // blocks the engine may import (the last token is computed)
  int32_t local_ = 0;
  int32_t local_state_ = 0;  // with a per-sequence state: blocks a local hit can use (<= local_)
  int64_t num_layers_, block_size_, entry_dim_;
  int64_t block_bytes_, state_bytes_;  // state_bytes_ > 0: a layout with per-sequence streams
  int64_t max_offload_blocks_;
  PrefixStore::FetchResult result_;
  double fetch_seconds_ = 0;
  std::unique_ptr<OffloadKvSink> offload_;
  std::unique_ptr<OffloadSequenceKvSink> offload_sequence_;
};

}  // namespace tandem
