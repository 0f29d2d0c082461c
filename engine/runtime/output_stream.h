// What the engine hands back for one request: a stream of outputs (new tokens, their
// text, logprobs; at the end the finish reason, status and metrics). The engine thread
// pushes and never blocks: when the consumer falls behind, new tokens are merged into the
// pending output, so the queue per request holds at most one output whatever happens.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/stop_checker.h"

namespace tandem {

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

struct RequestMetrics {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;    // prompt tokens whose KV came from the prefix cache
  int32_t imported_prompt_tokens = 0;  // of those, imported with the request (prefix_kv.h)
  int32_t computed_prompt_tokens = 0;  // prompt tokens the model ran (recomputation included)
  int32_t completion_tokens = 0;
  int32_t preemptions = 0;
  double queue_s = 0;    // submitted -> first scheduled
  double prefill_s = 0;  // first scheduled -> first token
  double ttft_s = 0;     // submitted -> first token
  double e2e_s = 0;      // submitted -> finished
  // Speculative decoding: drafts verified, and of those accepted.
  int32_t draft_tokens = 0;
  int32_t accepted_draft_tokens = 0;
};

struct RequestOutput {
  std::vector<int32_t> token_ids;       // tokens generated since the previous output
  std::string text;                     // their text (valid UTF-8; stop strings removed)
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for logprobs
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<std::string> matched_stop;
  // OK, or why the request ended early: CANCELLED, RESOURCE_EXHAUSTED (KV cache too small
  // for it), UNAVAILABLE (engine shut down), INTERNAL.
  absl::Status status;
  RequestMetrics metrics;  // complete in the final output; ttft once the first token exists
  // Prefill-only requests of an engine that drafts (EngineOptions::speculative_tokens): the
  // model's hidden state at the prompt's last position, in the final output, for the
  // decode replica's first draft pass (EngineRequest::mtp_hidden).
  std::vector<float> last_hidden;
};

class OutputStream {
 public:
  // Consumer side. Blocks until an output is pending; returns false once the final output
  // has been returned.
  bool Next(RequestOutput* out);
  // Non-blocking: the pending output, if any.
  std::optional<RequestOutput> TryNext();
  // For asynchronous consumers: called (on the engine thread; must not block) whenever an
  // output becomes pending. Set it before outputs can arrive or check TryNext after.
  void SetListener(std::function<void()> listener);

  // Producer side (engine thread).
  void Push(RequestOutput output);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<RequestOutput> pending_;
  bool final_pushed_ = false;
  bool final_returned_ = false;
  std::function<void()> listener_;
};

}  // namespace tandem
