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

// The prompt's token ids: text through the tokenizer (BOS as configured), ids checked
// against the vocabulary, chat messages through the DeepSeek chat format. Errors:
// INVALID_ARGUMENT naming the field (empty prompt, bad id, unknown role).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& r, const Tokenizer& tokenizer,
                                                  int64_t vocab_size);
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
