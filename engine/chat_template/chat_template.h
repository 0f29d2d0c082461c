// Chat templates: a model's `chat_template` (Jinja, from tokenizer_config.json) rendered
// the way transformers' apply_chat_template renders it, by Tandem's own interpreter of
// the Jinja subset chat templates use. The output is byte-identical to Python's Jinja2
// configured as transformers configures it (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loopcontrols; its tojson, raise_exception and
// strftime_now; the {% generation %} tag), which tests/unit/engine/chat_template checks
// on real templates.
//
// Supported: {{ }}, {% %}, {# #} with `-`/`+` whitespace control; if/elif/else; for
// (tuple targets, `if` filter, else, loop.*, break/continue); set (tuple unpacking,
// namespace attributes, block set with filters); macros; filter blocks; Python's
// operators, slicing, str/dict/list methods; Jinja2's filters and tests except those
// listed below; Jinja2's default Undefined (renders empty, is falsy, raises on
// arithmetic, comparison or attribute access).
//
// Not supported (an error when a template uses them): include/import/extends/block,
// call blocks, recursive loops, *args/**kwargs, macros' varargs/kwargs/caller, the
// filters format, groupby, slice, pprint, random, striptags, urlize, urlencode,
// wordwrap, xmlattr, filesizeformat, str.format, integers beyond 64 bits. Known
// deviations in output: case mapping covers ASCII, Latin-1, Latin Extended-A, Greek
// (without the final-sigma rule) and Cyrillic only; repr() of a few rarely used objects
// (range(), dict views, reversed iterators, built-in methods) differs from Python's;
// Markup's methods do not escape their arguments; slicing a constant that is not a
// sequence raises, where Jinja2's compile-time folding of constants gives Undefined.
//
// Every render is bounded (ChatTemplateLimits), so a hostile template can neither hang
// nor exhaust memory, and a bad template or input is an error, never an abort.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct ChatTemplateLimits {
  int64_t max_output_bytes = int64_t{64} << 20;
  // Bytes of strings and lists a render may build, all told (copies included): dozens
  // of times what a 4 MiB prompt needs.
  int64_t max_allocated_bytes = int64_t{256} << 20;
  // Statements, expression nodes and loop iterations.
  int64_t max_steps = 20'000'000;
  int max_call_depth = 64;  // nested macro calls
  // The clock of strftime_now, microseconds since the epoch; null: the system clock.
  std::function<int64_t()> now_micros;
};

class ChatTemplate {
 public:
  // Errors: INVALID_ARGUMENT "chat template line L, column C: ..." for a syntax error, a
  // filter or test Jinja2 does not know (Jinja2 refuses those when it compiles), or a
  // construct listed above as not supported.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with `context`'s members as the template's variables (a JSON object; its
  // key order is kept, as Python dicts keep theirs, since tojson and items() show it).
  // Errors: INVALID_ARGUMENT "chat template line L, column C: <Python exception>:
  // <message>" for a runtime error, including raise_exception("...") (TemplateError)
  // and operations on undefined values where Jinja2 raises; RESOURCE_EXHAUSTED when a
  // limit is reached.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const ChatTemplateLimits& limits = ChatTemplateLimits()) const;

  const std::string& source() const;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

// Special tokens as tokenizer_config.json names them; transformers passes the ones that
// are set to the template (special_tokens_map).
struct SpecialTokens {
  std::optional<std::string> bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token;
};

// One apply_chat_template call.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when the request has none (the template sees None)
  bool add_generation_prompt = true;
  // chat_template_kwargs (e.g. {"thinking": true}), merged at the top level.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// The context transformers renders a template with: messages, tools, documents (None),
// add_generation_prompt, the special tokens that are set, then the kwargs (which may
// override a special token). Errors: INVALID_ARGUMENT when messages is not an array,
// tools neither null nor an array, kwargs not an object, or a kwarg named messages,
// tools, documents or add_generation_prompt (Python refuses those twice given).
absl::StatusOr<nlohmann::ordered_json> MakeChatContext(const ChatRequest& request, const SpecialTokens& tokens);

}  // namespace tandem
