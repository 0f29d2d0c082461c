#include "engine/model/deepseek_v4/v4_paged_model.h"

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/deepseek_v4/v4_pool_state.h"
#include "kernels/common/check.h"

namespace tandem::v4 {

absl::StatusOr<std::unique_ptr<PagedV4Model>> PagedV4Model::Load(const std::string& dir,
                                                                 const DeepseekV4Model::LoadOptions& options) {
  absl::StatusOr<std::unique_ptr<DeepseekV4Model>> model = DeepseekV4Model::Load(dir, options);
  if (!model.ok()) return model.status();
  return std::unique_ptr<PagedV4Model>(new PagedV4Model(std::move(*model)));
}

std::vector<KvStream> PagedV4Model::kv_streams() const { return KvStreamsFor(config()); }

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
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> PagedV4Model::Forward(std::span<const ForwardSequence> batch, KvPool& pool,
                                                         const ForwardOptions& options) {
  if (absl::Status s = Check(batch, pool); !s.ok()) return s;
  const DeepseekV4Config& c = config();
  std::vector<float> logits;
  for (const ForwardSequence& q : batch) {
    SequenceState state = model_->NewSequence();
    if (q.start_position > 0) LoadState(c, pool, q.block_table, q.state_slot, q.start_position, &state);
    absl::StatusOr<std::vector<float>> out = model_->Forward(q.tokens, state, q.all_logits);
    // Check has ruled out every error Forward reports.
    TANDEM_CHECK(out.ok()) << out.status();
    StoreState(c, state, q.start_position, pool, q.block_table, q.state_slot);
    if (!q.no_logits) logits.insert(logits.end(), out->begin(), out->end());
  }
  if (options.after_layer_kv) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) options.after_layer_kv(l);
  }
  if (options.before_sampling) options.before_sampling();
  return logits;
}

}  // namespace tandem::v4
