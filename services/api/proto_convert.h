// Conversions between tandem.v1 messages and the engine's structs, with validation that
// names the offending request field ("sampling.temperature: ..."), so every service
// rejects bad input the same way, with INVALID_ARGUMENT.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/output_stream.h"
#include "engine/runtime/sampling_params.h"
#include "engine/tokenizer/tokenizer.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

// Unset proto fields take the engine's defaults. Errors: INVALID_ARGUMENT naming the field
// with its "sampling." / "stop." prefix.
absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& p, int64_t vocab_size);
absl::StatusOr<StopParams> FromProto(const v1::StopConditions& p, int64_t vocab_size);
void ToProto(const SamplingParams& s, v1::SamplingParams* p);
void ToProto(const StopParams& s, v1::StopConditions* p);

// The default of --max-prompt-bytes (router, --role both workers): 4 MiB, gRPC's
// default limit on a received message, which the router's port has always applied to a
// whole request. A prompt that fills DeepSeek-V3's 160K-token context is about 0.6 MiB of
// English (~4 bytes a token) and under 2 MiB of any text its vocabulary does not merge
// well, so no prompt the model can take is refused; tokenizing 4 MiB of mixed text
// (English, Japanese, emoji, digits) with DeepSeek-V3's tokenizer took 0.71 s of one
// core on the 2-core CI machine (1.09M tokens).
inline constexpr int64_t kDefaultMaxPromptBytes = int64_t{4} << 20;

// The bytes of a request's prompt that would be tokenized: the text, or the chat
// messages' roles and contents (token ids are not tokenized: CheckLength bounds them).
int64_t PromptBytes(const v1::GenerateRequest& r);
int64_t ChatBytes(const v1::ChatMessages& chat);
// Errors: INVALID_ARGUMENT "prompt: N bytes ... exceed ... --max-prompt-bytes (M)".
absl::Status CheckPromptBytes(int64_t bytes, int64_t max_prompt_bytes);

// The prompt's token ids: text through the tokenizer (BOS as configured), ids checked
// against the vocabulary, chat messages through the DeepSeek chat format. A prompt of
// more than `max_prompt_bytes` (PromptBytes) is refused before any tokenization work.
// Errors: INVALID_ARGUMENT naming the field (empty or oversize prompt, bad id, unknown
// role, a prompt the tokenizer's pattern cannot split within its budget).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& r, const Tokenizer& tokenizer,
                                                  int64_t vocab_size, int64_t max_prompt_bytes);
// DeepSeek-V3's chat format: BOS, system text, then "<｜User｜>...<｜Assistant｜>..." turns,
// ending with "<｜Assistant｜>" for the reply.
absl::StatusOr<std::string> FormatChat(const v1::ChatMessages& chat, const Tokenizer& tokenizer);

// The prompt must leave room for max_tokens in the model's context (as vLLM checks).
// Errors: INVALID_ARGUMENT naming "prompt" or "stop.max_tokens".
absl::Status CheckLength(int64_t prompt_tokens, const StopParams& stop, int64_t context);

// A request id the caller chose (printable ASCII, <= 128 bytes) or a fresh one.
absl::StatusOr<std::string> RequestIdOrNew(const std::string& requested);

v1::FinishReason ToProto(FinishReason r);
// Token ids, text, logprobs (and, when finished, finish reason and usage) of an engine
// output into a response message.
void ToProto(const RequestOutput& o, v1::GenerateResponse* out);

}  // namespace tandem
