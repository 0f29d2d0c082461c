// Hugging Face `tokenizer.json` tokenizers (byte-level BPE, as DeepSeek-V2/V3 ship), giving
// exactly the ids the Hugging Face `tokenizers` library gives, plus BOS/EOS handling from
// `tokenizer_config.json` the way transformers applies it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  // Errors: NOT_FOUND (no tokenizer.json), INVALID_ARGUMENT (malformed JSON, or a
  // component type or option this implementation does not support, named in the message).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDir(const std::string& dir);
  // Same, from the files' contents; config_json may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json);
  virtual ~Tokenizer() = default;

  // Token ids of `text`. Added and special tokens that appear in the text are matched as
  // Hugging Face does. add_special_tokens=true prepends BOS / appends EOS as
  // tokenizer_config.json's add_bos_token / add_eos_token say. Invalid UTF-8 in `text`
  // is first replaced by U+FFFD (one per maximal invalid subsequence). Errors:
  // INVALID_ARGUMENT when the pre-tokenizer's pattern exhausts its backtracking budget on
  // `text` (regex.h; never for the patterns of real tokenizers on any text, but a
  // tokenizer.json may carry a pattern that backtracks exponentially). Services encode
  // what clients send with this.
  virtual absl::StatusOr<std::vector<int32_t>> TryEncode(std::string_view text, bool add_special_tokens) const = 0;
  // TryEncode for text the program trusts (tests, tools): aborts on an error.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD, as Hugging Face's
  // byte-level decoder does. Ids out of range are skipped.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  virtual int32_t vocab_size() const = 0;  // largest id + 1
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // An added token of tokenizer.json, special or not (DeepSeek's tool-call markers are
  // added tokens that are not special): text equal to its content always encodes to it,
  // so it is a unit of the format rather than a piece of text.
  virtual bool IsAdded(int32_t id) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::string IdToToken(int32_t id) const = 0;  // empty if unknown
  // The raw bytes a token stands for (after byte-level decoding); special tokens give
  // their content. Used by streaming detokenization.
  virtual std::string TokenBytes(int32_t id) const = 0;
};

// Turns a stream of token ids into text deltas, holding back bytes of an incomplete
// UTF-8 sequence until it completes (or proves invalid, when it becomes U+FFFD).
// The concatenation of all deltas plus Finish() equals Tokenizer::Decode of all ids.
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string Push(int32_t id);
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace tandem
