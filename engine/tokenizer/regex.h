// Regular expressions for pre-tokenization, on PCRE2 in Unicode mode (PCRE2_UTF |
// PCRE2_UCP), made to behave like the Oniguruma regexes Hugging Face tokenizers uses:
// `\s` / `\S` mean Unicode White_Space (PCRE2's own `\s` also takes U+180E), `\h` / `\H`
// mean hex digits, general categories `\p{L}`, `\p{Lo}`, ... include the code points
// Unicode 15.0-16.0 assigned (see unicode_additions.h), and FindAll yields matches exactly
// as the onig crate's find_iter does.
// A compiled Regex is immutable and may be used from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer_internal {

class Regex {
 public:
  // Errors: INVALID_ARGUMENT naming the pattern and PCRE2's message.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern matching `literal` exactly.
  static std::string Escape(std::string_view literal);
  // The Oniguruma pattern rewritten for PCRE2 (exposed for tests).
  static std::string TranslateOniguruma(std::string_view pattern);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Backtracking budget of one search over n bytes: kMatchLimitBase + kMatchLimitPerByte
  // x n steps (PCRE2's match limit, and its depth limit). Tokenizer patterns take a few
  // steps per character; one that backtracks exponentially exhausts the budget.
  static constexpr uint64_t kMatchLimitBase = 1'000'000;
  static constexpr uint64_t kMatchLimitPerByte = 64;

  // Byte ranges [start, end) of the successive non-overlapping matches in `subject`
  // (valid UTF-8), searching on after each match; an empty match right where the previous
  // match ended is skipped. Lookarounds see only `subject`. Errors: INVALID_ARGUMENT when
  // a search exhausts its budget (the message names the pattern and where it gave up).
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(std::string_view subject) const;

  // Whether the regex matches a prefix of `subject` (anchored at its start); false also
  // when the search exhausts its budget (used on one character at a time).
  bool MatchesPrefix(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}
  std::string pattern_;
  void* code_;  // pcre2_code_8*, kept out of this header
};

}  // namespace tandem::tokenizer_internal
