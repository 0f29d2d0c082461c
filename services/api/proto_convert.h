// Conversions between tandem.v1 messages and the engine's structs, with validation that
// names the offending request field ("sampling.temperature: ..."), so every service
// rejects bad input the same way, with INVALID_ARGUMENT.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat_template/model_chat_templates.h"
#include "engine/runtime/output_constraint.h"
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
// An unset constraint is OutputConstraint::Kind::kNone. Errors: INVALID_ARGUMENT naming
// "constraint.<kind>" (empty or oversize text, options on a kind without them).
absl::StatusOr<OutputConstraint> FromProto(const v1::Constraint& c);
void ToProto(const OutputConstraint& c, v1::Constraint* p);
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
// messages' text fields, tools and template variables (token ids are not tokenized:
// CheckLength bounds them).
int64_t PromptBytes(const v1::GenerateRequest& r);
int64_t ChatBytes(const v1::ChatMessages& chat);
// Errors: INVALID_ARGUMENT "prompt: N bytes ... exceed ... --max-prompt-bytes (M)".
absl::Status CheckPromptBytes(int64_t bytes, int64_t max_prompt_bytes);

// The prompt's token ids: text through the tokenizer (BOS as configured), ids checked
// against the vocabulary, chat messages through FormatChat. A prompt of more than
// `max_prompt_bytes` (PromptBytes) is refused before any tokenization work.
// `chat_templates`: the model's (null for a model without one). Errors:
// INVALID_ARGUMENT naming the field (empty or oversize prompt, bad id, unknown role, a
// chat the template refuses, a prompt the tokenizer's pattern cannot split within its
// budget).
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& r, const Tokenizer& tokenizer,
                                                  int64_t vocab_size, int64_t max_prompt_bytes,
                                                  const ModelChatTemplates* chat_templates);

// Chat messages as prompt text, in the model's chat format: its chat template
// (tokenizer_config.json's chat_template, rendered as transformers' apply_chat_template
// renders it, with add_generation_prompt; the text carries BOS itself, so tokenizing it
// adds no special tokens, as transformers does); or, for a model without a template
// (`templates` null), the DeepSeek-V3 format Tandem used before it read templates:
// system text, then "<｜User｜>..." and "<｜Assistant｜>...<｜end▁of▁sentence｜>" turns,
// ending with "<｜Assistant｜>", tokenized with BOS as configured. The template sees
// each message as OpenAI's message object (content None for an assistant turn that only
// calls tools; tool_calls as {"id", "type", "function": {"name", "arguments"}}), tools
// as given (key order kept) and template_kwargs_json's members as variables. Tools,
// tool calls and tool results need a template. Errors: INVALID_ARGUMENT
// "chat.messages...", "chat.tools_json: ...", "chat.template_kwargs_json: ..." or
// "chat: <the template's error>".
struct ChatPrompt {
  std::string text;
  bool add_special_tokens = true;
};
absl::StatusOr<ChatPrompt> FormatChat(const v1::ChatMessages& chat, const ModelChatTemplates* templates);

// The chat templates of the model in `model_dir` (ModelChatTemplates::Load), or null
// when it has none. Errors: a tokenizer_config.json or template that cannot be read or
// parsed (a model that would fail every chat request is refused at startup).
absl::StatusOr<std::unique_ptr<ModelChatTemplates>> LoadChatTemplates(const std::string& model_dir);

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
