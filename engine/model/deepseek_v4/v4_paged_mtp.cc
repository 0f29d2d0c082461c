// DeepSeek-V4's draft pass over the paged pool (docs/speculative-decoding.md): per
// sequence the MTP layer over its new MTP positions (their ring rows stored in its state
// slot), then chained runs from the last one, each from the previous run's output streams
// and draft, on a copy of the ring the pool never sees (the next pass recomputes those
// positions from the tokens that stood).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "engine/model/deepseek_v4/v4_pool_state.h"
#include "engine/model/draft_choice.h"
#include "kernels/common/check.h"

namespace tandem::v4 {

absl::Status PagedV4Model::CheckDrafts(std::span<const DraftSequence> batch, const KvPool& pool) const {
  const DeepseekV4Config& c = config();
  if (!mtp_) {
    return absl::FailedPreconditionError("a draft pass needs the MTP layer, which this model was loaded without");
  }
  const int64_t hs = c.hc_mult * c.hidden_size;
  const int64_t kept_rows = static_cast<int64_t>(kept_hidden_.size()) / hs;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequence& s = batch[i];
    const std::string who = absl::StrCat("draft sequence ", i, ": ");
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat(who, "no slots"));
    const int64_t last = s.first_slot + n - 1 + std::max(0, s.max_drafts - 1);
    if (s.first_slot < 1 || last >= c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(who, "slots [", s.first_slot, ", ", last,
                                                     "] are outside [1, max_position_embeddings ",
                                                     c.max_position_embeddings, ")"));
    }
    if (s.state_slot < 0 || s.state_slot >= pool.geometry().num_sequence_slots) {
      return absl::InvalidArgumentError(absl::StrCat(who, "state slot ", s.state_slot, " outside the pool's ",
                                                     pool.geometry().num_sequence_slots));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(who, "token ", t, " outside the vocabulary of ", c.vocab_size));
      }
    }
    if (s.hidden.size() % static_cast<size_t>(hs) != 0 || static_cast<int64_t>(s.hidden.size()) > n * hs) {
      return absl::InvalidArgumentError(absl::StrCat(who, s.hidden.size(), " hidden values are not whole rows of ",
                                                     hs, " for ", n, " slots"));
    }
    for (float v : s.hidden) {
      if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(who, "a hidden value is not finite"));
    }
    const int64_t kept = n - static_cast<int64_t>(s.hidden.size()) / hs;
    if (kept > 0 && (s.hidden_row < 0 || s.hidden_row + kept > kept_rows)) {
      return absl::InvalidArgumentError(absl::StrCat(who, "hidden rows [", s.hidden_row, ", ", s.hidden_row + kept,
                                                     ") were not kept (", kept_rows, " were)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<DraftToken>>> PagedV4Model::Draft(std::span<const DraftSequence> batch,
                                                                         KvPool& pool) {
  if (absl::Status st = Check({}, pool); !st.ok()) return st;
  if (absl::Status st = CheckDrafts(batch, pool); !st.ok()) return st;
  const DeepseekV4Config& c = config();
  const int64_t hs = c.hc_mult * c.hidden_size;
  std::vector<std::vector<DraftToken>> drafts(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequence& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    // Slot q is MTP position q - 1: the hidden streams there and the token at q.
    const int64_t first = s.first_slot - 1;
    std::vector<float> hidden(s.hidden.begin(), s.hidden.end());
    const int64_t kept = n - static_cast<int64_t>(s.hidden.size()) / hs;
    hidden.insert(hidden.end(), kept_hidden_.begin() + s.hidden_row * hs,
                  kept_hidden_.begin() + (s.hidden_row + kept) * hs);
    LayerState ring = model_->NewMtpState();
    if (first > 0) LoadMtpRing(c, pool, s.state_slot, &ring);
    std::vector<float> streams;
    std::vector<float> logits = model_->RunMtp(hidden.data(), s.tokens, first, ring, &streams, s.max_drafts > 0);
    StoreMtpRing(c, ring, pool, s.state_slot);

    std::vector<DraftToken>& out = drafts[i];
    int64_t position = first + n;
    while (static_cast<int32_t>(out.size()) < s.max_drafts) {
      if (s.allowed) {
        const std::span<const uint32_t> allowed = s.allowed(out.empty() ? -1 : out.back().token);
        if (allowed.empty() || !MaskDisallowed(logits.data(), c.vocab_size, allowed)) break;
      }
      const DraftToken chosen = ChooseDraft(logits.data(), c.vocab_size);
      if (chosen.confidence < s.min_confidence) break;
      out.push_back(chosen);
      if (static_cast<int32_t>(out.size()) == s.max_drafts) break;
      const std::vector<float> last(streams.end() - hs, streams.end());
      logits = model_->RunMtp(last.data(), {&chosen.token, 1}, position++, ring, &streams);
    }
  }
  return drafts;
}

}  // namespace tandem::v4
