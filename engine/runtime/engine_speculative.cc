// Speculative decoding's half of a step (docs/speculative-decoding.md): each verify chunk's
// drafts checked against the target's logits, the draft pass of the MTP layer, outputs.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

// DraftSequence::allowed for a constrained sequence: its matcher takes each draft (counted
// in *taken, for a rollback after the pass) and gives the mask of the next.
std::function<std::span<const uint32_t>(int32_t)> DraftMask(Sequence& s, int64_t vocab, int* taken,
                                                             std::vector<uint32_t>* mask) {
  const size_t words = std::max((static_cast<size_t>(vocab) + 31) / 32, s.matcher->grammar().vocabulary().mask_words());
  return [&s, words, taken, mask](int32_t previous) -> std::span<const uint32_t> {
    if (previous >= 0) {
      if (!s.matcher->AcceptToken(previous)) return {};
      ++*taken;
    }
    if (s.matcher->IsTerminated()) return {};
    mask->assign(words, 0u);
    s.matcher->FillNextTokenBitmask(*mask);
    return *mask;
  };
}

}  // namespace

void Engine::EmitSpeculative(const StepPlan& plan, std::vector<float>* logits,
                             const std::vector<int32_t>* device_tokens) {
  const ModelInfo& info = backend_->config();
  const int64_t vocab = info.vocab_size;
  const double after = Now();
  // Sequences that go on, with their outputs and draft passes (the spans point into the
  // sequences' tokens and imported hidden states, untouched until the pass returns).
  std::vector<Sequence*> going_on;
  std::vector<RequestOutput> outputs;
  std::vector<DraftSequence> passes;
  int64_t row = 0;   // of the logits
  int64_t kept = 0;  // of the hidden states the forward pass kept (every chunk reaching its end)
  // Whether this step's sequences draft for the next (draft_policy.h): their MTP slots are
  // filled either way.
  int64_t decoding = 0;
  for (const ScheduledChunk& c : plan.chunks) decoding += c.reaches_end() ? 1 : 0;
  const bool draft = !options_.speculative_adaptive || draft_policy_.Drafts(decoding);
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.reaches_end()) continue;
    Sequence& s = *c.seq;
    const int64_t kept_base = kept;
    kept += c.num_tokens;
    RequestOutput out;
    bool finished = false;
    int32_t accepted = 0;
    for (int32_t j = 0; j <= c.num_drafts; ++j) {
      const int32_t step = ChosenTokens(s);
      const bool verifying = j < c.num_drafts;
      const int32_t draft = verifying ? s.verify_tokens[static_cast<size_t>(j) + 1] : -1;
      SampledToken t;
      bool draft_accepted = false;
      if (device_tokens != nullptr) {
        // Chosen on the device as Sample would: the draft stands when it is that token.
        t.token = (*device_tokens)[static_cast<size_t>(row + j)];
        draft_accepted = verifying && t.token == draft;
        counters_.device_sampled_tokens++;
      } else {
        std::span<float> lg(logits->data() + (row + j) * vocab, static_cast<size_t>(vocab));
        if (s.matcher) {
          ConstrainLogits(s, lg, step);
        } else if (step < s.min_tokens) {
          SuppressTokens(lg, eos_ids_);
          SuppressTokens(lg, s.stop_token_ids);
        }
        // The position's own seeded draw decides (docs/speculative-decoding.md): the draft
        // stands when it is the token Sample chooses, which happens with probability p(d),
        // the standard rule's for a one-hot draft, and the output is the token the request
        // would have had without drafts.
        t = sampler_.Sample(lg, s.sampling, s.seed, step, s.prompt(), s.generated());
        draft_accepted = verifying && t.token == draft;
      }
      if (draft_accepted) ++accepted;
      if (s.matcher) AcceptConstrained(s, t.token);
      const StopResult r = s.stop->OnToken(t.token);
      s.tokens.push_back(t.token);
      scheduler_->OnTokenAppended(s);
      counters_.generated_tokens++;
      if (s.first_token_at < 0) s.first_token_at = after;
      if (step == 0) out.metrics.ttft_s = s.first_token_at - s.submitted_at;
      finished = AppendToOutput(s, t, r, out);
      if (finished || !draft_accepted) break;
    }
    row += 1 + c.num_drafts;
    if (c.num_drafts > 0) {
      // The backend's per-sequence state (rings, compressor windows) moves past the
      // accepted drafts; the pass's inputs were checked, so a refusal is the engine's bug.
      const absl::Status moved = backend_->AcceptDrafts(s.state_slot, accepted);
      TANDEM_CHECK(moved.ok()) << s.id << ": " << moved;
      counters_.spec_draft_tokens += c.num_drafts;
      for (int32_t p = 0; p < accepted; ++p) counters_.spec_accepted_by_position[static_cast<size_t>(p)]++;
      counters_.spec_accepted_length[static_cast<size_t>(accepted)]++;
      s.metrics.draft_tokens += c.num_drafts;
      s.metrics.accepted_draft_tokens += accepted;
    }
    if (finished) {
      if (s.kv_sink != nullptr) {
        // The decode replica's first draft pass starts from the prompt's last hidden state.
        absl::StatusOr<std::vector<float>> h = backend_->KeptHidden(kept_base + c.num_tokens - 1);
        TANDEM_CHECK(h.ok()) << h.status();
        out.last_hidden = std::move(*h);
      }
      Finish(scheduler_->Remove(s.id), std::move(out));
      continue;
    }
    if (c.num_drafts > 0) scheduler_->OnDraftsAccepted(s, accepted);

    // The MTP slots of the positions this step computed, then the next drafts: a plain
    // step's only slot is the new token's; a verify step's are its accepted drafts' and the
    // new token's.
    DraftSequence d = DraftPassFor(s, c.num_drafts > 0 ? c.start + 1 : c.start + c.num_tokens);
    d.hidden_row = kept_base + d.first_slot - 1 - c.start;
    if (!draft) d.max_drafts = 0;
    passes.push_back(d);
    going_on.push_back(&s);
    outputs.push_back(std::move(out));
  }
  if (logits != nullptr) TANDEM_CHECK_EQ(row * vocab, static_cast<int64_t>(logits->size()));
  if (device_tokens != nullptr) TANDEM_CHECK_EQ(row, static_cast<int64_t>(device_tokens->size()));

  for (size_t i = 0; i < going_on.size(); ++i) going_on[i]->output->Push(std::move(outputs[i]));
  if (passes.empty()) return;
  // A constrained sequence drafts within its grammar: its matcher takes each draft to mask
  // the next, and gives them back after the pass.
  std::vector<int> taken(passes.size(), 0);
  std::vector<std::vector<uint32_t>> masks(passes.size());
  for (size_t i = 0; i < passes.size(); ++i) {
    Sequence* s = going_on[i];
    if (!s->matcher || passes[i].max_drafts == 0) continue;
    passes[i].allowed = DraftMask(*s, info.vocab_size, &taken[i], &masks[i]);
  }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> drafts = backend_->Draft(passes, *pool_);
  for (size_t i = 0; i < passes.size(); ++i) {
    if (taken[i] > 0) going_on[i]->matcher->Rollback(taken[i]);
  }
  for (size_t i = 0; i < going_on.size(); ++i) {
    Sequence& s = *going_on[i];
    if (drafts.ok()) {
      s.drafts.clear();
      for (const DraftToken& t : (*drafts)[i]) s.drafts.push_back(t.token);
      continue;
    }
    // Inputs were checked: a failed draft pass is the engine's bug, but it ends the
    // requests it hit rather than the process.
    RequestOutput o;
    o.status = absl::InternalError(absl::StrCat("draft pass failed: ", drafts.status().message()));
    Finish(scheduler_->Remove(s.id), std::move(o));
  }
}

bool Engine::SpeculativeDeviceRows(const StepPlan& plan, std::vector<SampleRow>* rows) {
  rows->clear();
  if (!options_.sample_on_device || !backend_->samples_on_device()) return false;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.reaches_end()) continue;
    Sequence& s = *c.seq;
    // What the device sampler has not (DeviceSampleRows' conditions), or a constraint.
    if (s.sampling.logprobs > 0 || s.num_generated() < s.min_tokens || !s.sampling.logit_bias.empty() || s.matcher) {
      rows->clear();
      return false;
    }
    // Row j samples output position ChosenTokens + j after the drafts before it (its
    // result counts only when they are accepted): their history, for the penalties.
    s.verify_history.assign(s.tokens.begin() + s.prompt_len, s.tokens.end());
    if (c.num_drafts > 0) s.verify_history.insert(s.verify_history.end(), s.verify_tokens.begin() + 1, s.verify_tokens.end());
    for (int32_t j = 0; j <= c.num_drafts; ++j) {
      rows->push_back({.temperature = s.sampling.temperature,
                       .top_p = s.sampling.top_p,
                       .top_k = s.sampling.top_k,
                       .min_p = s.sampling.min_p,
                       .repetition_penalty = s.sampling.repetition_penalty,
                       .presence_penalty = s.sampling.presence_penalty,
                       .frequency_penalty = s.sampling.frequency_penalty,
                       .seed = s.seed,
                       .step = ChosenTokens(s) + j,
                       .prompt_tokens = s.prompt(),
                       .output_tokens = std::span<const int32_t>(s.verify_history).first(
                           static_cast<size_t>(s.num_generated() + j))});
    }
  }
  return !rows->empty();
}

DraftSequence Engine::DraftPassFor(const Sequence& s, int64_t first_slot) const {
  const ModelInfo& info = backend_->config();
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  DraftSequence d{.first_slot = first_slot,
                  .tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(first_slot),
                                                                       static_cast<size_t>(len - first_slot)),
                  .block_table = s.blocks,
                  .state_slot = s.state_slot,
                  .min_confidence = options_.speculative_min_confidence};
  if (s.speculative) {
    // A verify step emits at most drafts + 1 tokens, inside max_tokens and the context.
    const int64_t room = std::min<int64_t>(s.max_tokens - ChosenTokens(s) - 1, info.max_position_embeddings - len);
    d.max_drafts = static_cast<int32_t>(std::clamp<int64_t>(room, 0, options_.speculative_tokens));
  }
  return d;
}

bool Engine::DraftAfterImport(std::unique_ptr<Sequence>& seq) {
  Sequence& s = *seq;
  // Slot P (the prompt's length) from the prompt's last hidden state and the first token.
  DraftSequence d = DraftPassFor(s, static_cast<int64_t>(s.tokens.size()) - 1);
  d.hidden = s.imported_hidden;
  int taken = 0;
  std::vector<uint32_t> mask;
  if (s.matcher && d.max_drafts > 0) d.allowed = DraftMask(s, backend_->config().vocab_size, &taken, &mask);
  absl::StatusOr<std::vector<std::vector<DraftToken>>> drafts = backend_->Draft({&d, 1}, *pool_);
  if (taken > 0) s.matcher->Rollback(taken);
  s.imported_hidden.clear();
  if (!drafts.ok()) {
    RequestOutput o;
    o.status = absl::InternalError(absl::StrCat("draft pass failed: ", drafts.status().message()));
    scheduler_->PoolOf(s).Release(s.blocks);
    s.blocks.clear();
    Finish(std::move(seq), std::move(o));
    return false;
  }
  for (const DraftToken& t : (*drafts)[0]) s.drafts.push_back(t.token);
  return true;
}

}  // namespace tandem
