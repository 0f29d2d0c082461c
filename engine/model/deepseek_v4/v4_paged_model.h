// DeepSeek-V4 on the CPU over a paged KV pool of its streams (v4_kv_streams.h), in the
// model-neutral vocabulary (engine/model/forward_batch.h): a batch of sequences, each
// with its new tokens, its start position, its block table and its state slot. The
// compressed entries and indexer keys live in the sequence's blocks, the sliding-window
// ring and the compressors' unfinished windows in its slot; each sequence's step loads
// its state from the pool (v4_pool_state.h), runs DeepseekV4Model::Forward and stores
// what it added, so the logits are bitwise those of one unbroken DeepseekV4Model state.
// This is what the V4 CPU backend serves with; computing in the pool directly, without
// the state copy, is the next step for speed.
//
// Speculative decoding (Options::mtp; docs/speculative-decoding.md): the pool then also
// holds the MTP layer's ring and each sequence's last hidden streams (KvStreamsFor with
// mtp). A pass fills the MTP positions of its sequences' prompt chunks, keeps hidden
// streams for Draft, and for a sequence verifying drafts stores its state as after the
// tokens before them, keeping what AcceptDrafts needs to move it past the accepted ones.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/model/forward_batch.h"
#include "engine/model/kv_pool.h"

namespace tandem::v4 {

class PagedV4Model {
 public:
  struct Options {
    int num_threads = 0;  // 0: all hardware threads
    bool mtp = false;     // load for speculative decoding (the checkpoint's MTP layer)
    bool fp8_activation_rounding = false;  // DeepseekV4Model::LoadOptions's
  };
  // Errors: DeepseekV4Model::Load's; FAILED_PRECONDITION for mtp without an MTP layer in
  // the checkpoint, UNIMPLEMENTED for an MTP layer whose attention is not a sliding window.
  static absl::StatusOr<std::unique_ptr<PagedV4Model>> Load(const std::string& dir, const Options& options);

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
  // With mtp: ForwardSequence's mtp, mtp_next_token, keep_hidden, first_kv_cached and
  // num_drafts as forward_batch.h describes them (first_kv_cached takes the first token's
  // hidden streams from the pool, where the state it continues left them).
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& pool,
                                             const ForwardOptions& options = {});

  bool mtp() const { return mtp_; }
  // ModelBackend::AcceptDrafts: the sequence of `slot`, which verified drafts in the last
  // Forward, continues after `accepted` of them. Errors: FAILED_PRECONDITION when that
  // Forward verified none for the slot, INVALID_ARGUMENT for more than it verified.
  absl::Status AcceptDrafts(int64_t slot, int32_t accepted, KvPool& pool);
  // ModelBackend::Draft (the MTP layer's ring in each sequence's state slot).
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch, KvPool& pool);
  // Row `row` of the hidden streams the last Forward kept.
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const;

 private:
  PagedV4Model(std::unique_ptr<DeepseekV4Model> model, bool mtp) : model_(std::move(model)), mtp_(mtp) {}
  absl::Status Check(std::span<const ForwardSequence> batch, const KvPool& pool) const;
  absl::Status CheckDrafts(std::span<const DraftSequence> batch, const KvPool& pool) const;
  // One sequence of a pass; appends its logits rows to *logits.
  void ForwardOne(const ForwardSequence& q, KvPool& pool, std::vector<float>* logits);
  // The MTP positions a prompt chunk fills (ForwardSequence::mtp) from its hidden rows.
  void FillMtp(const ForwardSequence& q, const std::vector<float>& hidden, KvPool& pool);

  // A sequence that verified drafts: its state after every token of the pass, what the
  // drafts overwrote, and the hidden streams of the positions it may stop after.
  struct Verified {
    SequenceState state;
    StateUndo undo;
    std::vector<float> hidden;  // rows for positions undo.from - 1 ... undo.end - 1
    std::vector<int32_t> block_table;
  };

  std::unique_ptr<DeepseekV4Model> model_;
  bool mtp_ = false;
  std::vector<float> kept_hidden_;                        // keep_hidden rows of the last pass
  absl::flat_hash_map<int64_t, Verified> verified_;        // by state slot, from the last pass
};

}  // namespace tandem::v4
