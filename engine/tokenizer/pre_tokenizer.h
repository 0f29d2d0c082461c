// Pre-tokenizers: split text into the pieces the model tokenizes one by one, exactly as
// Hugging Face's Split, ByteLevel, Digits and Sequence pre-tokenizers do. Every step
// applies to each piece the previous step produced; empty pieces are dropped.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/regex.h"

namespace tandem::tokenizer_internal {

// What becomes of the delimiters a pattern matches. With "-" on "the-final--countdown":
// kRemoved: the final countdown; kIsolated: the - final - - countdown;
// kMergedWithPrevious: the- final- - countdown; kMergedWithNext: the -final - -countdown;
// kContiguous: the - final -- countdown.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A segmentation of a string: contiguous ranges covering it, each flagged as a match of
// the pattern or not.
using Segments = std::vector<std::pair<std::pair<size_t, size_t>, bool>>;

// The segmentation of `text` by the matches of `regex` (Hugging Face's find_matches).
// Errors: Regex::FindAll's (a search over its budget).
absl::StatusOr<Segments> SegmentByRegex(const Regex& regex, std::string_view text);

// Appends to `out` the non-empty pieces of `text` that `segments` and `behavior` give.
void SplitSegments(std::string_view text, const Segments& segments, SplitBehavior behavior,
                   std::vector<std::string>* out);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenized pieces, in order. Errors: INVALID_ARGUMENT
  // when a pattern's search exceeds its backtracking budget (Regex::FindAll); `pieces`
  // is then unspecified.
  virtual absl::Status PreTokenize(std::vector<std::string>* pieces) const = 0;
};

// Split: pattern (a regex, or a literal string) with a delimiter behavior, optionally
// inverted (the pattern then matches the pieces rather than the delimiters).
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces) const override;

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// ByteLevel: optionally prefixes a space to each piece not starting with one, optionally
// splits with GPT-2's regex, then maps every byte to its byte-level character.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  absl::Status PreTokenize(std::vector<std::string>* pieces) const override;

 private:
  bool add_prefix_space_;
  bool use_regex_;
  const Regex* gpt2_regex_;  // shared, never freed
};

// Digits: numeric characters (Unicode N) isolated one by one, or as runs.
class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits);
  absl::Status PreTokenize(std::vector<std::string>* pieces) const override;

 private:
  bool individual_digits_;
  const Regex* numeric_regex_;  // shared, never freed
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status PreTokenize(std::vector<std::string>* pieces) const override;

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace tandem::tokenizer_internal
