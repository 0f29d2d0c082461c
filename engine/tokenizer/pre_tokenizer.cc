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

// Applies `split` to every piece, replacing the list.
template <typename SplitFn>
void ForEachPiece(std::vector<std::string>* pieces, SplitFn split) {
  std::vector<std::string> out;
  out.reserve(pieces->size());
  for (const std::string& piece : *pieces) split(piece, &out);
  *pieces = std::move(out);
}

}  // namespace

Segments SegmentByRegex(const Regex& regex, std::string_view text) {
  Segments segments;
  if (text.empty()) {
    segments.push_back({{0, 0}, false});
    return segments;
  }
  size_t prev = 0;
  for (const auto& [start, end] : regex.FindAll(text)) {
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

void SplitPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    Segments segments = SegmentByRegex(*regex_, piece);
    if (invert_) {
      for (auto& segment : segments) segment.second = !segment.second;
    }
    SplitSegments(piece, segments, behavior_, out);
  });
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  static const Regex* const gpt2 = CompileShared(kGpt2Pattern);
  gpt2_regex_ = gpt2;
}

void ByteLevelPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    std::string prefixed;
    std::string_view text = piece;
    if (add_prefix_space_ && (text.empty() || text.front() != ' ')) {
      prefixed = " " + piece;
      text = prefixed;
    }
    const size_t first = out->size();
    if (use_regex_) {
      SplitSegments(text, SegmentByRegex(*gpt2_regex_, text), SplitBehavior::kIsolated, out);
    } else if (!text.empty()) {
      out->emplace_back(text);
    }
    for (size_t i = first; i < out->size(); ++i) (*out)[i] = BytesToByteLevel((*out)[i]);
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

void DigitsPreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  ForEachPiece(pieces, [this](const std::string& piece, std::vector<std::string>* out) {
    SplitSegments(piece, SegmentByRegex(*numeric_regex_, piece),
                  individual_digits_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
  });
}

void SequencePreTokenizer::PreTokenize(std::vector<std::string>* pieces) const {
  for (const auto& step : steps_) step->PreTokenize(pieces);
}

}  // namespace tandem::tokenizer_internal
