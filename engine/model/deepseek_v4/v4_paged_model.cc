#include "engine/model/deepseek_v4/v4_paged_model.h"

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/deepseek_v4/v4_pool_state.h"
#include "engine/model/deepseek_v4/v4_state_undo.h"
#include "kernels/common/check.h"

namespace tandem::v4 {

absl::StatusOr<std::unique_ptr<PagedV4Model>> PagedV4Model::Load(const std::string& dir, const Options& options) {
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> model = DeepseekV4Model::Load(
      dir, {.num_threads = options.num_threads, .fp8_activation_rounding = options.fp8_activation_rounding});
  if (!model.ok()) return model.status();
  if (options.mtp) {
    const DeepseekV4Config& c = (*model)->config();
    if (!(*model)->has_mtp()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "speculative decoding needs the checkpoint's MTP layer (mtp.0.* tensors): ", dir,
          c.num_nextn_predict_layers > 0 ? " has none (a checkpoint transformers saved drops them)"
                                         : " has num_nextn_predict_layers 0"));
    }
    if (c.mtp_attention_type != AttentionType::kSliding) {
      return absl::UnimplementedError(absl::StrCat("speculative decoding with an MTP layer of ",
                                                   AttentionTypeName(c.mtp_attention_type),
                                                   " attention (only a sliding-window MTP layer is built)"));
    }
  }
  return std::unique_ptr<PagedV4Model>(new PagedV4Model(std::move(*model), options.mtp));
}

std::vector<KvStream> PagedV4Model::kv_streams() const { return KvStreamsFor(config(), mtp_); }

absl::Status PagedV4Model::Check(std::span<const ForwardSequence> batch, const KvPool& pool) const {
  const DeepseekV4Config& c = config();
  const std::vector<KvStream> want = kv_streams();
  for (const KvStream& s : want) {
    const int i = pool.StreamIndex(s.name);
    if (i < 0 || pool.streams()[i].width != s.width || pool.streams()[i].tokens != s.tokens ||
        pool.streams()[i].layers != s.layers || pool.streams()[i].dtype != s.dtype ||
        pool.streams()[i].granularity != s.granularity) {
      return absl::FailedPreconditionError(absl::StrCat("the KV pool does not hold this model's stream '", s.name,
                                                        "' (", DescribeKvStreams({s}), ")"));
    }
  }
  const int64_t block_size = pool.geometry().block_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& q = batch[i];
    const std::string who = absl::StrCat("sequence ", i, " of the batch: ");
    if (q.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(who, "no tokens"));
    for (int32_t t : q.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(who, "token ", t, " outside the vocabulary of ", c.vocab_size));
      }
    }
    const int64_t end = q.start_position + static_cast<int64_t>(q.tokens.size());
    if (q.start_position < 0 || end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(who, "positions ", q.start_position, "..", end - 1,
                                                     " outside 0..", c.max_position_embeddings - 1));
    }
    if (static_cast<int64_t>(q.block_table.size()) * block_size < end) {
      return absl::InvalidArgumentError(absl::StrCat(who, q.block_table.size(), " blocks do not cover ", end,
                                                     " positions"));
    }
    for (int32_t b : q.block_table) {
      if (b < 0 || b >= pool.geometry().num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(who, "block ", b, " outside the pool"));
      }
    }
    if (q.state_slot < 0 || q.state_slot >= pool.geometry().num_sequence_slots) {
      return absl::InvalidArgumentError(absl::StrCat(who, "state slot ", q.state_slot, " outside the pool's ",
                                                     pool.geometry().num_sequence_slots));
    }
    if (!mtp_ && (q.mtp || q.keep_hidden || q.first_kv_cached || q.num_drafts > 0)) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, "asks for the MTP layer (speculative decoding), which this model was loaded without"));
    }
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    if (q.first_kv_cached && (n < 2 || q.num_drafts > 0 || q.all_logits)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "first_kv_cached needs a token after the cached one, and no drafts or all_logits"));
    }
    if (q.num_drafts < 0 || (q.num_drafts > 0 && (q.num_drafts >= n || !q.all_logits || n > c.sliding_window))) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, q.num_drafts, " drafts: a verify pass has drafts after at least one token, all logits, and at most ",
          c.sliding_window, " tokens"));
    }
    if (q.mtp_next_token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(who, "mtp_next_token ", q.mtp_next_token,
                                                     " outside the vocabulary of ", c.vocab_size));
    }
  }
  return absl::OkStatus();
}

void PagedV4Model::ForwardOne(const ForwardSequence& q, KvPool& pool, std::vector<float>* logits) {
  const DeepseekV4Config& c = config();
  const int64_t hs = c.hc_mult * c.hidden_size;
  std::span<const int32_t> tokens = q.tokens;
  int64_t start = q.start_position;
  std::vector<float> hidden;
  if (q.first_kv_cached) {
    // The state continues after the cached token; its hidden streams are the pool's.
    hidden = LoadLastHidden(c, pool, q.state_slot);
    tokens = tokens.subspan(1);
    ++start;
  }
  SequenceState state = model_->NewSequence();
  if (start > 0) LoadState(c, pool, q.block_table, q.state_slot, start, &state);
  std::vector<float> new_hidden;
  StateUndo undo;
  DeepseekV4Model::ForwardExtras extras;
  if (mtp_) extras.hidden = &new_hidden;
  if (q.num_drafts > 0) {
    extras.undo = &undo;
    extras.undo_from = start + static_cast<int64_t>(tokens.size()) - q.num_drafts;
  }
  absl::StatusOr<std::vector<float>> out = model_->Forward(tokens, state, q.all_logits, extras);
  // Check has ruled out every error Forward reports.
  TANDEM_CHECK(out.ok()) << out.status();
  hidden.insert(hidden.end(), new_hidden.begin(), new_hidden.end());  // rows of q.tokens
  if (q.num_drafts > 0) {
    // The pool holds the state as after the tokens before the drafts until AcceptDrafts.
    Verified v{.state = state, .undo = std::move(undo)};
    TakeBack(v.undo, v.undo.from, c.sliding_window, state);
    const int64_t first_row = v.undo.from - 1 - q.start_position;
    v.hidden.assign(hidden.begin() + first_row * hs, hidden.end());
    v.block_table.assign(q.block_table.begin(), q.block_table.end());
    StoreState(c, state, start, pool, q.block_table, q.state_slot);
    StoreLastHidden(c, std::span<const float>(v.hidden).first(static_cast<size_t>(hs)), pool, q.state_slot);
    verified_[q.state_slot] = std::move(v);
  } else {
    StoreState(c, state, start, pool, q.block_table, q.state_slot);
    if (mtp_) StoreLastHidden(c, std::span<const float>(hidden).last(static_cast<size_t>(hs)), pool, q.state_slot);
  }
  if (mtp_ && q.mtp) FillMtp(q, hidden, pool);
  if (q.keep_hidden) kept_hidden_.insert(kept_hidden_.end(), hidden.begin(), hidden.end());
  if (!q.no_logits) logits->insert(logits->end(), out->begin(), out->end());
}

void PagedV4Model::FillMtp(const ForwardSequence& q, const std::vector<float>& hidden, KvPool& pool) {
  // MTP position start + j from the hidden streams of row j and the token after it.
  std::vector<int32_t> tokens(q.tokens.begin() + 1, q.tokens.end());
  if (q.mtp_next_token >= 0) tokens.push_back(q.mtp_next_token);
  if (tokens.empty()) return;
  LayerState ring = model_->NewMtpState();
  if (q.start_position > 0) LoadMtpRing(config(), pool, q.state_slot, &ring);
  std::vector<float> streams;
  model_->RunMtp(hidden.data(), tokens, q.start_position, ring, &streams, /*logits=*/false);
  StoreMtpRing(config(), ring, pool, q.state_slot);
}

absl::Status PagedV4Model::AcceptDrafts(int64_t slot, int32_t accepted, KvPool& pool) {
  const auto it = verified_.find(slot);
  if (it == verified_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("state slot ", slot, " verified no drafts in the last pass"));
  }
  Verified& v = it->second;
  const int64_t drafts = v.undo.end - v.undo.from;
  if (accepted < 0 || accepted > drafts) {
    return absl::InvalidArgumentError(absl::StrCat(accepted, " drafts accepted of ", drafts, " verified"));
  }
  if (accepted > 0) {
    const DeepseekV4Config& c = config();
    const int64_t hs = c.hc_mult * c.hidden_size;
    TakeBack(v.undo, v.undo.from + accepted, c.sliding_window, v.state);
    StoreState(c, v.state, v.undo.from, pool, v.block_table, slot);
    StoreLastHidden(c, std::span<const float>(v.hidden).subspan(static_cast<size_t>(accepted * hs),
                                                               static_cast<size_t>(hs)),
                    pool, slot);
  }
  verified_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> PagedV4Model::KeptHidden(int64_t row) const {
  const int64_t hs = config().hc_mult * config().hidden_size;
  if (row < 0 || (row + 1) * hs > static_cast<int64_t>(kept_hidden_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("hidden row ", row, " was not kept (",
                                                   static_cast<int64_t>(kept_hidden_.size()) / hs, " were)"));
  }
  return std::vector<float>(kept_hidden_.begin() + row * hs, kept_hidden_.begin() + (row + 1) * hs);
}

absl::StatusOr<std::vector<float>> PagedV4Model::Forward(std::span<const ForwardSequence> batch, KvPool& pool,
                                                         const ForwardOptions& options) {
  if (absl::Status s = Check(batch, pool); !s.ok()) return s;
  const DeepseekV4Config& c = config();
  std::vector<float> logits;
  kept_hidden_.clear();
  verified_.clear();
  for (const ForwardSequence& q : batch) ForwardOne(q, pool, &logits);
  if (options.after_layer_kv) {
    for (int64_t l = 0; l < c.num_hidden_layers + (mtp_ ? 1 : 0); ++l) options.after_layer_kv(l);
  }
  if (options.before_sampling) options.before_sampling();
  return logits;
}

}  // namespace tandem::v4
