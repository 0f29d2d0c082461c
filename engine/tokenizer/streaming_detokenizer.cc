// StreamingDetokenizer: Decode, one id at a time. Decoding is per-token bytes followed by
// one lossy UTF-8 conversion, and that conversion decides each character (or each
// U+FFFD) as soon as its bytes are complete or proven invalid, so only the bytes of a
// still-possible character need to wait.
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace tandem {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDetokenizer::Push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return "";
  pending_ += tokenizer_.TokenBytes(id);
  std::string delta;
  const size_t consumed = tokenizer_internal::Utf8LossyPrefix(pending_, &delta);
  pending_.erase(0, consumed);
  return delta;
}

std::string StreamingDetokenizer::Finish() {
  std::string rest = tokenizer_internal::Utf8Lossy(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem
