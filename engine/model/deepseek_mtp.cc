// DeepSeek-V3's multi-token-prediction layer on the CPU: the MTP slots a forward pass fills
// and the draft pass of speculative decoding (docs/speculative-decoding.md).
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/draft_choice.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm_rope_act.h"

namespace tandem {

void DeepseekModel::MtpLayer(std::span<const AttentionRows> seqs, const float* hidden, const int32_t* tokens,
                             int64_t rows, float* y, LatentKvCache& cache, const DeepseekForwardOptions& options) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const WeightMatrix& embed = mtp_->embed.valid() ? mtp_->embed : weights().embed;
  // [rows][enorm(embed(token)) | hnorm(hidden)], projected back to the hidden size.
  std::vector<float> both(static_cast<size_t>(rows * 2 * d));
  for (int64_t r = 0; r < rows; ++r) {
    float* e = &both[r * 2 * d];
    cpu::DequantizeRows(embed, tokens[r], 1, e);
    cpu::RmsNorm(e, 1, d, d, mtp_->enorm, eps, e, d);
    cpu::RmsNorm(hidden + r * d, 1, d, d, mtp_->hnorm, eps, e + d, d);
  }
  cpu::Matmul({.x = both.data(), .m = rows, .x_stride = 2 * d, .w = &mtp_->eh_proj, .y = y, .y_stride = d}, *pool_);
  // The MTP layer's KV is the pool's last layer, slot q holding position q - 1.
  const int64_t layer = c.num_hidden_layers;
  DecoderLayer(mtp_->block, layer, layer, /*slot_offset=*/1, seqs, y, rows, cache, options);
}

void DeepseekModel::FillMtpSlots(std::span<const ForwardSequence> batch, const float* x, LatentKvCache& cache,
                                 const DeepseekForwardOptions& options) {
  const int64_t d = config_.hidden_size;
  std::vector<AttentionRows> seqs;
  std::vector<float> hidden;
  std::vector<int32_t> tokens;
  int64_t r = 0;
  for (const ForwardSequence& s : batch) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    // Slot start + 1 + j from the hidden state of row j and the token after it.
    const int64_t slots = s.mtp ? n - 1 + (s.mtp_next_token >= 0 ? 1 : 0) : 0;
    if (slots > 0) {
      hidden.insert(hidden.end(), x + r * d, x + (r + slots) * d);
      tokens.insert(tokens.end(), s.tokens.begin() + 1, s.tokens.end());
      if (s.mtp_next_token >= 0) tokens.push_back(s.mtp_next_token);
      seqs.push_back({.first_position = s.start_position, .num_tokens = slots, .block_table = s.block_table});
    }
    r += n;
  }
  const int64_t rows = static_cast<int64_t>(tokens.size());
  if (rows == 0) {
    // Nothing to fill, but a caller streaming every layer's KV still hears of this one.
    if (options.after_layer_kv) options.after_layer_kv(config_.num_hidden_layers);
    return;
  }
  std::vector<float> y(static_cast<size_t>(rows * d));
  MtpLayer(seqs, hidden.data(), tokens.data(), rows, y.data(), cache, options);
}

std::vector<float> DeepseekModel::MtpLogits(const float* y, int64_t rows) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  const int64_t vocab = c.vocab_size;
  std::vector<float> normed(static_cast<size_t>(rows * d));
  cpu::RmsNorm(y, rows, d, d, mtp_->shared_head_norm, static_cast<float>(c.rms_norm_eps), normed.data(), d);
  const WeightMatrix& head = mtp_->shared_head.valid() ? mtp_->shared_head : weights().lm_head;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  cpu::Matmul({.x = normed.data(), .m = rows, .x_stride = d, .w = &head, .y = logits.data(), .y_stride = vocab},
              *pool_);
  return logits;
}


absl::StatusOr<std::vector<std::vector<DraftToken>>> DeepseekModel::Draft(std::span<const DraftSequence> batch,
                                                                          LatentKvCache& cache,
                                                                          const DeepseekForwardOptions& options) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  if (mtp_ == nullptr) {
    return absl::FailedPreconditionError("a draft pass needs the MTP layer, which this model was loaded without");
  }
  if (cache.num_layers() != c.num_hidden_layers + 1) {
    return absl::InvalidArgumentError(absl::StrCat("a model with its MTP layer needs a KV cache of ",
                                                   c.num_hidden_layers + 1, " layers, not ", cache.num_layers()));
  }
  const int64_t kept_rows = static_cast<int64_t>(kept_hidden_.size()) / d;
  std::vector<AttentionRows> seqs;
  std::vector<float> hidden;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequence& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, " has no slots"));
    const int64_t last = s.first_slot + n - 1 + std::max(0, s.max_drafts - 1);
    if (s.first_slot < 1 || last >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": slots [", s.first_slot, ", ", last,
                                                     "] are outside [1, max_position_embeddings ",
                                                     c.max_position_embeddings, ")"));
    }
    if (static_cast<int64_t>(s.block_table.size()) * cache.block_size() <= last) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": ", s.block_table.size(),
                                                     " cache blocks cannot hold slot ", last));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= cache.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": block id ", b, " out of range"));
      }
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary (size ",
                                                       c.vocab_size, ")"));
      }
    }
    if (s.hidden.size() % static_cast<size_t>(d) != 0 || static_cast<int64_t>(s.hidden.size()) > n * d) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": ", s.hidden.size(),
                                                     " hidden values are not whole rows of ", d, " for ", n,
                                                     " slots"));
    }
    for (float v : s.hidden) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": a hidden value is not finite"));
      }
    }
    hidden.insert(hidden.end(), s.hidden.begin(), s.hidden.end());
    const int64_t kept = n - static_cast<int64_t>(s.hidden.size()) / d;
    if (kept > 0) {
      if (s.hidden_row < 0 || s.hidden_row + kept > kept_rows) {
        return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": hidden rows [", s.hidden_row, ", ",
                                                       s.hidden_row + kept, ") were not kept (", kept_rows,
                                                       " were)"));
      }
      hidden.insert(hidden.end(), kept_hidden_.begin() + s.hidden_row * d,
                    kept_hidden_.begin() + (s.hidden_row + kept) * d);
    }
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    seqs.push_back({.first_position = s.first_slot - 1, .num_tokens = n, .block_table = s.block_table});
  }

  std::vector<std::vector<DraftToken>> drafts(batch.size());
  std::vector<float> y(static_cast<size_t>(tokens.size()) * d);
  MtpLayer(seqs, hidden.data(), tokens.data(), static_cast<int64_t>(tokens.size()), y.data(), cache, options);

  // Chained runs: each still-drafting sequence's last output and draft give its next slot.
  struct Chain {
    size_t seq;
    int64_t last_row;  // of y
    int64_t slot;      // of the last row
  };
  std::vector<Chain> active;
  int64_t row_end = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    row_end += static_cast<int64_t>(batch[i].tokens.size());
    if (batch[i].max_drafts > 0) {
      active.push_back({i, row_end - 1, batch[i].first_slot + static_cast<int64_t>(batch[i].tokens.size()) - 1});
    }
  }
  while (!active.empty()) {
    std::vector<float> last(active.size() * static_cast<size_t>(d));
    for (size_t k = 0; k < active.size(); ++k) {
      std::copy_n(&y[active[k].last_row * d], d, &last[k * d]);
    }
    std::vector<float> logits = MtpLogits(last.data(), static_cast<int64_t>(active.size()));
    const int64_t vocab = c.vocab_size;
    std::vector<Chain> next;
    std::vector<int32_t> next_tokens;
    std::vector<float> next_hidden;
    seqs.clear();
    for (size_t k = 0; k < active.size(); ++k) {
      const DraftSequence& s = batch[active[k].seq];
      std::vector<DraftToken>& out = drafts[active[k].seq];
      float* l = &logits[k * static_cast<size_t>(vocab)];
      if (s.allowed) {
        const std::span<const uint32_t> allowed = s.allowed(out.empty() ? -1 : out.back().token);
        if (allowed.empty()) continue;
        if (!MaskDisallowed(l, vocab, allowed)) continue;  // nothing allowed
      }
      const DraftToken chosen = ChooseDraft(l, vocab);
      if (chosen.confidence < s.min_confidence) continue;
      out.push_back(chosen);
      if (static_cast<int32_t>(out.size()) == s.max_drafts) continue;
      const int64_t slot = active[k].slot + 1;
      next.push_back({active[k].seq, static_cast<int64_t>(next.size()), slot});
      next_tokens.push_back(chosen.token);
      next_hidden.insert(next_hidden.end(), &last[k * d], &last[(k + 1) * d]);
      seqs.push_back({.first_position = slot - 1, .num_tokens = 1, .block_table = s.block_table});
    }
    if (next.empty()) break;
    std::vector<float> next_y(next.size() * static_cast<size_t>(d));
    MtpLayer(seqs, next_hidden.data(), next_tokens.data(), static_cast<int64_t>(next.size()), next_y.data(), cache,
             options);
    y = std::move(next_y);
    active = std::move(next);
  }
  return drafts;
}

}  // namespace tandem
