// Per-request sampling and stop parameters, with vLLM's meanings, and their validation.
// The RPC / CLI edge converts a request into these structs and calls Validate before the
// request reaches the engine thread; the sampler and the stop checker then trust them
// (a value outside the documented ranges there is a bug and fails a CHECK or misbehaves).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

// How the next token is chosen from the model's logits. See sampler.h for the order in
// which the fields apply.
struct SamplingParams {
  // Logits are divided by it before sampling. Valid: [0, 100]. Values below
  // kGreedyTemperature (including 0) mean greedy decoding (argmax), as in vLLM.
  float temperature = 1.0f;
  // Nucleus sampling: keep the smallest set of most likely tokens whose probability mass
  // is at least top_p. Valid: (0, 1]; 1 = off.
  float top_p = 1.0f;
  // Keep the top_k most likely tokens. Valid: >= -1; 0 and -1 = off. Larger than the
  // vocabulary = off.
  int32_t top_k = 0;
  // Drop tokens whose probability is below min_p times the most likely token's.
  // Valid: [0, 1]; 0 = off.
  float min_p = 0.0f;
  // Tokens present in the prompt or the output so far: positive logits divided by it,
  // negative logits multiplied by it (Hugging Face / vLLM). Valid: (0, 10]; 1 = off.
  float repetition_penalty = 1.0f;
  // Subtracted from the logit of every token already in the output. Valid: [-2, 2].
  float presence_penalty = 0.0f;
  // Subtracted from a token's logit once per occurrence in the output. Valid: [-2, 2].
  float frequency_penalty = 0.0f;
  // Makes sampling reproducible: with a seed, the token at output position i depends only
  // on (logits, parameters, seed, i, token history). Without one the engine picks a seed
  // per request. Any value is valid.
  std::optional<uint64_t> seed;
  // Number of most likely alternatives (with their log-probabilities) returned with each
  // sampled token. Valid: [0, 20]; at most the vocabulary size are returned.
  int32_t logprobs = 0;
  // Added to a token's logit before penalties and sampling (OpenAI's logit_bias): -100
  // all but bans a token, +100 all but forces it. Valid: at most kMaxLogitBias entries,
  // ids in the vocabulary, each once, biases finite in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

// Validation limits, exported so that the RPC edge can document them.
inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxRepetitionPenalty = 10.0f;
inline constexpr float kMaxAbsPresenceFrequencyPenalty = 2.0f;
inline constexpr int32_t kMaxLogprobs = 20;
inline constexpr size_t kMaxLogitBias = 1024;
inline constexpr float kMaxAbsLogitBias = 100.0f;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// When a sequence finishes (see stop_checker.h for the exact rules).
struct StopParams {
  // The sequence ends (finish reason "length") after this many generated tokens.
  // Valid: >= 1. The default, 256, is an engine-side safety net; vLLM's OpenAI server
  // defaults to the remaining context instead (and its offline API to 16), so front ends
  // should always set it explicitly.
  int32_t max_tokens = 256;
  // EOS, stop tokens and stop strings do not end the sequence before this many tokens.
  // Valid: [0, max_tokens].
  int32_t min_tokens = 0;
  // Text that ends the sequence; matched on the decoded text, across token boundaries.
  // Valid: at most 16, each non-empty, at most 256 bytes, valid UTF-8.
  std::vector<std::string> stop;
  // Tokens that end the sequence (their text is not emitted). Valid: ids in the vocabulary.
  std::vector<int32_t> stop_token_ids;
  // Keep generating past the model's EOS tokens (stop_token_ids still apply).
  bool ignore_eos = false;
  // Emit the matched stop string at the end of the text (it is dropped by default).
  bool include_stop_str_in_output = false;
  // Drop special tokens' text from the output (Tokenizer::IsSpecial), as vLLM does by
  // default; false keeps it.
  bool skip_special_tokens = true;
};

// INVALID_ARGUMENT, naming the field and the valid range, for any value outside the
// ranges above (NaN and infinities included). vocab_size must be positive (checked).
absl::Status Validate(const SamplingParams& params, int64_t vocab_size);
absl::Status Validate(const StopParams& params, int64_t vocab_size);

}  // namespace tandem
