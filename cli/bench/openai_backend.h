// The OpenAI-compatible HTTP backends of `tandem bench`: streaming POST /v1/completions
// (openai-completions: the dataset's token ids as the prompt, as vLLM's bench sends
// them) or /v1/chat/completions (openai-chat: the prompt's text, from the server's
// /detokenize, as one user message), with `stream: true` and
// `stream_options.include_usage`. TTFT is the first event carrying output text, ITL the
// gaps between such events, the output tokens those of the final usage event. OpenAI's
// /v1/models does not give the vocabulary size the random prompts need: ProbeVocabSize
// learns it from /detokenize.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/bench/bench_backend.h"
#include "cli/bench/http_client.h"

namespace tandem::cli {

enum class OpenAiEndpoint { kCompletions, kChat };

struct OpenAiBackendOptions {
  HttpBaseUrl base_url;  // e.g. http://127.0.0.1:8000/v1
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string api_key;   // sent as Authorization: Bearer KEY when set
  RequestSettings settings;
  int threads = 2;       // the HTTP client's
};

// UNAVAILABLE when the base URL's host does not resolve.
absl::StatusOr<std::unique_ptr<BenchBackend>> MakeOpenAiBackend(OpenAiBackendOptions options);

}  // namespace tandem::cli
