#include "engine/tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "engine/tokenizer/byte_level.h"
#include "kernels/common/check.h"

namespace tandem::tokenizer_internal {
namespace {

// GPT-2's pre-tokenization regex, as Hugging Face's ByteLevel uses it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const Regex* CompileShared(std::string_view pattern) {
  auto regex = Regex::Compile(pattern);
  TANDEM_CHECK(regex.ok()) << regex.status().ToString();
  return regex->release();
}

// Applies `split` (returning absl::Status) to every piece, replacing the list; stops at
// the first error.
template <typename SplitFn>
absl::Status ForEachPiece(std::vector<std::string>* pieces, SplitFn split) {
  std::vector<std::string> out;
  out.reserve(pieces->size());
  for (const std::string& piece : *pieces) {
    if (absl::Status st = split(piece, &out); !st.ok()) return st;
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Segments> SegmentByRegex(const Regex& regex, std::string_view text) {
  Segments segments;
  if (text.empty()) {
    segments.push_back({{0, 0}, false});
    return segments;
  }
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> matches = regex.FindAll(text);
  if (!matches.ok()) return matches.status();
  size_t prev = 0;
  for (const auto& [start, end] : *matches) {
    if (prev != start) segments.push_back({{prev, start}, false});
    segments.push_back({{start, end}, true});
    prev = end;
  }
  if (prev != text.size()) segments.push_back({{prev, text.size()}, false});
  return segments;
}

void SplitSegments(std::string_view text, const Segments& segments, SplitBehavior behavior,
                   std::vector<std::string>* out) {
  // (range, remove) pairs, computed as Hugging Face's NormalizedString::split does.
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> splits;
  splits.reserve(segments.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [range, is_match] : segments) splits.push_back({range, false});
      break;
    case SplitBehavior::kRemoved:
      splits = segments;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [range, is_match] : segments) {
        if (is_match == previous_match && !splits.empty()) {
          splits.back().first.second = range.second;
        } else {
          splits.push_back({range, false});
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [range, is_match] : segments) {
        if (is_match && !previous_match && !splits.empty()) {
          splits.back().first.second = range.second;
        } else {
          splits.push_back({range, false});
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        const auto& [range, is_match] = *it;
        if (is_match && !previous_match && !splits.empty()) {
          splits.back().first.first = range.first;
        } else {
          splits.push_back({range, false});
        }
        previous_match = is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const auto& [range, remove] : splits) {
    if (!remove && range.second > range.first) {
      out->emplace_back(text.substr(range.first, range.second - range.first));
    }
  }
}

absl::Status SplitPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  return ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    absl::StatusOr<Segments> segments = SegmentByRegex(*regex_, piece);
    if (!segments.ok()) return segments.status();
    if (invert_) {
      for (auto& segment : *segments) segment.second = !segment.second;
    }
    SplitSegments(piece, *segments, behavior_, out);
    return absl::OkStatus();
  });
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  static const Regex* const gpt2 = CompileShared(kGpt2Pattern);
  gpt2_regex_ = gpt2;
}

absl::Status ByteLevelPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  return ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    std::string prefixed;
    std::string_view text = piece;
    if (add_prefix_space_ && (text.empty() || text.front() != ' ')) {
      prefixed = " " + piece;
      text = prefixed;
    }
    const size_t first = out->size();
    if (use_regex_) {
      absl::StatusOr<Segments> segments = SegmentByRegex(*gpt2_regex_, text);
      if (!segments.ok()) return segments.status();
      SplitSegments(text, *segments, SplitBehavior::kIsolated, out);
    } else if (!text.empty()) {
      out->emplace_back(text);
    }
    for (size_t i = first; i < out->size(); ++i) (*out)[i] = BytesToByteLevel((*out)[i]);
    return absl::OkStatus();
  });
}

DigitsPreTokenizer::DigitsPreTokenizer(bool individual_digits)
    : individual_digits_(individual_digits) {
  // One match per numeric character, as Rust's char::is_numeric (Nd, Nl, No) splits. The
  // Rust standard library of tokenizers 0.22 knows Unicode 17.0, one version beyond its
  // regexes: the Tolong Siki digits and U+16FF4..U+16FF6 are numeric there too.
  static const Regex* const numeric =
      CompileShared(R"([\p{N}\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6}])");
  numeric_regex_ = numeric;
}

absl::Status DigitsPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  return ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    absl::StatusOr<Segments> segments = SegmentByRegex(*numeric_regex_, piece);
    if (!segments.ok()) return segments.status();
    SplitSegments(piece, *segments, individual_digits_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
    return absl::OkStatus();
  });
}

absl::Status SequencePreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  for (const auto& step : steps_) {
    if (absl::Status st = step->PreTokenize(pieces); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace tandem::tokenizer_internal
