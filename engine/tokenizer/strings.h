// The Debian build of Abseil has its own absl::string_view, distinct from std::string_view:
// this bridges the two for StrCat and for heterogeneous hash-map lookups.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer_internal {

inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view AsStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace tandem::tokenizer_internal
