// DeepSeek-V4 on the CPU over a paged KV pool of its streams (v4_kv_streams.h), in the
// model-neutral vocabulary (engine/model/forward_batch.h): a batch of sequences, each
// with its new tokens, its start position, its block table and its state slot. The
// compressed entries and indexer keys live in the sequence's blocks, the sliding-window
// ring and the compressors' unfinished windows in its slot; each sequence's step loads
// its state from the pool (v4_pool_state.h), runs DeepseekV4Model::Forward and stores
// what it added, so the logits are bitwise those of one unbroken DeepseekV4Model state.
// This is what the V4 CPU backend serves with; computing in the pool directly, without
// the state copy, is the next step for speed.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/model/forward_batch.h"
#include "engine/model/kv_pool.h"

namespace tandem::v4 {

class PagedV4Model {
 public:
  static absl::StatusOr<std::unique_ptr<PagedV4Model>> Load(const std::string& dir,
                                                            const DeepseekV4Model::LoadOptions& options);

  const DeepseekV4Config& config() const { return model_->config(); }
  DeepseekV4Model& model() { return *model_; }
  // The streams a pool for this model must hold.
  std::vector<KvStream> kv_streams() const;

  // Runs the batch; logits [rows][vocab_size], rows in batch order: every new token of
  // sequences with all_logits, none of those with no_logits, the last token of the
  // others. A sequence at start_position 0 starts afresh whatever its slot held; the
  // others continue what the pool holds for their first start_position tokens.
  // options.after_layer_kv is called for every layer once the whole batch is computed.
  // Errors, before anything is computed or written: INVALID_ARGUMENT for no tokens, a
  // token outside the vocabulary, positions past max_position_embeddings, a block table
  // that does not cover the positions, a slot outside the pool; FAILED_PRECONDITION for a
  // pool without this model's streams.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& pool,
                                             const ForwardOptions& options = {});

 private:
  explicit PagedV4Model(std::unique_ptr<DeepseekV4Model> model) : model_(std::move(model)) {}
  absl::Status Check(std::span<const ForwardSequence> batch, const KvPool& pool) const;

  std::unique_ptr<DeepseekV4Model> model_;
};

}  // namespace tandem::v4
