// Helpers for finding marker strings (tags, special-token text) in streamed text, where a
// marker may be split across deltas and its beginning must be held back until settled.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace tandem::output_parsing {

// The length of the longest suffix of `text` that is a proper prefix of `marker` (0 when
// none is): the bytes that must wait for more text before they can be called ordinary.
size_t PartialMarkerSuffix(std::string_view text, std::string_view marker);

// The same for several markers: the longest such suffix for any of them.
size_t PartialMarkerSuffix(std::string_view text, std::initializer_list<std::string_view> markers);

// Whether `text` is a proper prefix of `marker` (so more text may complete it).
inline bool IsProperPrefixOf(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

}  // namespace tandem::output_parsing
