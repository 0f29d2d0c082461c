// Turns one sequence's sampled tokens into text deltas and decides when it finishes, with
// vLLM's rules. One StopChecker per sequence, used on the engine thread.
//
// For the n-th generated token (n counts every token, EOS and stop tokens included):
//   - EOS (any of the model's EOS ids, unless ignore_eos) or a stop_token_ids entry, when
//     n > min_tokens: finished, kStop; the token's text is not emitted. (When n <=
//     min_tokens it is an ordinary token; the engine should also keep such tokens from
//     being sampled then, see SuppressTokens in sampler.h, as vLLM does.)
//   - Otherwise the token's text is decoded (StreamingDetokenizer: special tokens skipped,
//     incomplete UTF-8 held back) and stop strings are looked for, when n >= min_tokens,
//     among the occurrences that end in the new text, across token boundaries. The one
//     that ends first wins (the longest if several end together), so the outcome does
//     not depend on how the text was split into tokens. The text is cut before the stop
//     string (after it with include_stop_str_in_output): finished, kStop, matched_stop.
//   - Otherwise, when n == max_tokens: finished, kLength.
//   A stop at the max_tokens-th token is kStop, not kLength.
// Text that might be the beginning of a stop string is held back until it is known not to
// be (never with include_stop_str_in_output, where no text needs retracting), so emitted
// text is never retracted. The finishing result's delta carries all the remaining text
// (held-back text, and incomplete UTF-8 as U+FFFD, as Tokenizer::Decode gives it); Flush()
// is for a sequence that ends for another reason (cancelled, context full).
// Without stops, the deltas of all results plus Flush() equal
// Tokenizer::Decode(tokens, params.skip_special_tokens).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "engine/runtime/sampling_params.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

enum class FinishReason {
  kNone,
  kStop,    // EOS, a stop token or a stop string
  kLength,  // max_tokens reached
};

struct StopResult {
  std::string text_delta;  // new text, valid UTF-8; may be empty
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::optional<std::string> matched_stop;     // the stop string that ended the sequence
  std::optional<int32_t> matched_stop_token;   // the stop_token_ids entry that ended it
                                               // (vLLM's stop_reason; not set for EOS)
};

class StopChecker {
 public:
  // `tokenizer` must outlive the checker. `params` must be valid (Validate); `eos_ids`
  // are the model's end-of-sequence ids (config and tokenizer).
  StopChecker(const Tokenizer& tokenizer, StopParams params, std::vector<int32_t> eos_ids);

  // Handles the next generated token. Calling it after a finishing result or Flush()
  // is a bug (checked).
  StopResult OnToken(int32_t token);

  // Ends the sequence where it is: returns the text still held back (stop-string
  // prefixes, incomplete UTF-8 as U+FFFD), cut at a stop string it may complete. Empty
  // after a finishing result. Later calls return "".
  std::string Flush();

  int32_t num_tokens() const { return num_tokens_; }
  bool done() const { return done_; }

 private:
  // Appends decoded text; with `match_stops`, looks for a stop string ending in it and,
  // on a match, fills `result` as finished and returns true.
  bool AppendText(const std::string& text, bool match_stops, StopResult* result);
  // The text from emitted_ up to `end`, then marks it emitted and drops old text.
  std::string EmitUpTo(size_t end);
  // Where the held-back suffix of text_ starts (text_.size() when none is).
  size_t HoldBackStart() const;
  // Ends the sequence with `reason`: the detokenizer's rest (which may still complete a
  // stop string) and all held-back text go into result->text_delta.
  void Finish(FinishReason reason, StopResult* result);

  StopParams params_;
  absl::flat_hash_set<int32_t> eos_ids_;
  absl::flat_hash_set<int32_t> stop_token_ids_;
  StreamingDetokenizer detokenizer_;
  size_t max_stop_bytes_ = 0;
  // Recent decoded text: everything not yet emitted, preceded by up to
  // max_stop_bytes_ - 1 bytes already emitted (where a stop string may begin).
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ already emitted
  int32_t num_tokens_ = 0;
  bool done_ = false;
};

}  // namespace tandem
