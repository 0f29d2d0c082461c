// The vocabulary every model backend speaks (engine/model/model_backend.h), whatever the
// architecture: the sequences of one forward pass, what the engine asks of the pass, and
// how a device backend samples a logits row. What only one architecture knows (DeepSeek's
// absorbed or expanded latent attention) stays in its own headers.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

namespace tandem {

struct ForwardSequence {
  std::span<const int32_t> tokens;       // new tokens, at positions start_position...
  int64_t start_position = 0;            // tokens of this sequence already in the cache
  std::span<const int32_t> block_table;  // cache blocks covering start_position + tokens.size()
  bool all_logits = false;               // logits for every new token, not only the last
  bool no_logits = false;                // no logits at all (a prefill chunk short of the end)
  // The sequence's slot in the KV pool's per-sequence streams (rings, states;
  // engine/model/kv_pool.h), for architectures that have them; -1: none.
  int64_t state_slot = -1;
  // Speculative decoding with the model's MTP layer (docs/speculative-decoding.md), on a
  // backend loaded with it (BackendOptions::mtp) over a pool whose last layer is the MTP
  // layer's. mtp: the MTP layer also fills its KV slots [start_position + 1,
  // start_position + n) from this pass's hidden states and these tokens, and slot
  // start_position + n when mtp_next_token >= 0 (the token after these, when known: a
  // prompt chunk short of the prompt's end).
  bool mtp = false;
  int32_t mtp_next_token = -1;
  // The final hidden states (after the last decoder layer, before the final norm) of this
  // sequence's new tokens stay in the backend for the next Draft call (DraftSequence::
  // hidden_row), in batch order, until the next Forward.
  bool keep_hidden = false;
  // The first new token's KV is already in the cache (a cached, maybe shared, prefix ends
  // there): the pass computes that token only for its hidden state, and writes none of its KV.
  bool first_kv_cached = false;
  // The last num_drafts tokens are drafts this pass verifies (all_logits). A backend whose
  // per-sequence state a refused draft would leave wrong (rings, compressor windows:
  // DeepSeek-V4) keeps the sequence's state as after the tokens before them and what it
  // needs to move it past the accepted ones (ModelBackend::AcceptDrafts).
  int32_t num_drafts = 0;
  // Data-parallel attention (docs/parallel.md): the rank of the replica's group whose KV
  // pool holds this sequence, and whose pool block_table indexes. That rank alone runs the
  // sequence's rows; 0 without data parallelism (backends of one rank ignore it).
  int32_t dp_rank = 0;
};

// One sequence of a draft pass (ModelBackend::Draft): the MTP layer over its slots
// [first_slot, first_slot + tokens.size()), slot q from the main model's hidden state at
// position q - 1 and the token at q (docs/speculative-decoding.md), then up to max_drafts
// chained runs from the last slot, each taking the previous run's output and draft.
struct DraftSequence {
  int64_t first_slot = 1;
  std::span<const int32_t> tokens;  // the token of each slot
  // The hidden state at q - 1 for each slot: first the rows of `hidden` (ModelInfo::
  // mtp_hidden_size() floats each: one a prefill replica handed over), then rows
  // hidden_row, hidden_row + 1, ... of what the last Forward kept (ForwardSequence::keep_hidden).
  std::span<const float> hidden;
  int64_t hidden_row = 0;
  // Covers slot first_slot + tokens.size() - 1 + max_drafts - 1 (the last chained run's).
  std::span<const int32_t> block_table;
  // The sequence's slot in the KV pool's per-sequence streams (where the MTP layer keeps a
  // ring: DeepSeek-V4); -1: none.
  int64_t state_slot = -1;
  int32_t max_drafts = 0;
  // Drafting stops before a draft whose probability under the MTP layer is below this.
  float min_confidence = 0.0f;
  // Structured output: before each draft, the tokens its grammar allows after the drafts
  // before it (a bitmask as SampleRow::allowed), called with the previous draft (-1 before
  // the first); an empty span stops the drafting. The draft and its confidence are the
  // masked logits'. The span stays valid until the next call.
  std::function<std::span<const uint32_t>(int32_t previous_draft)> allowed;
};

// A draft: the MTP layer's most likely token and its probability (softmax at temperature 1).
struct DraftToken {
  int32_t token = -1;
  float confidence = 0.0f;
};

struct ForwardOptions {
  // Called on the calling thread once layer `layer` has written the KV of every new token
  // of the batch, before the next layer starts: lets a prefill stream each layer's KV out
  // while later layers compute.
  std::function<void(int64_t layer)> after_layer_kv;
  // The callback only enqueues work on the device backend's stream (device-to-device KV
  // writes): the backend need not wait for the layer before calling it.
  bool after_layer_kv_enqueues_only = false;
  // Sampling backends (ForwardSample, LaunchSample): called on the calling thread once,
  // after the step's forward pass is enqueued on the device and before the sampling rows'
  // `allowed` masks are read, and before the call returns: the host fills the masks while
  // the device computes the forward pass.
  std::function<void()> before_sampling;
};

// How a device backend chooses one logits row's token (ModelBackend::ForwardSample): the
// CPU Sampler's parameters with its semantics (engine/runtime/sampler.h; temperature
// below 1e-5 is greedy), the seed and output position of UniformFromSeedStep, and the
// sequence's history for the penalties. The spans must stay valid during the call.
struct SampleRow {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int64_t step = 0;
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
  // Structured output: the tokens allowed (bit i % 32 of word i / 32; ids past the words
  // are not allowed); the others' logits are -inf before everything above. Empty: all.
  // Valid only during the call that takes the row (a launch copies it); its contents may
  // be written by ForwardOptions::before_sampling.
  std::span<const uint32_t> allowed;
};

}  // namespace tandem
