#include "engine/output_parsing/marker_matching.h"

#include <algorithm>

namespace tandem::output_parsing {

size_t PartialMarkerSuffix(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - (marker.empty() ? 0 : 1));
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

size_t PartialMarkerSuffix(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view marker : markers) best = std::max(best, PartialMarkerSuffix(text, marker));
  return best;
}

}  // namespace tandem::output_parsing
