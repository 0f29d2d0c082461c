#include "services/kvstore/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvstore {

absl::StatusOr<int64_t> ParseByteSize(const std::string& text, const std::string& what) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", text, "' is not a size (a number of bytes, or with K, M, G or T: 512M, 4G)"));
  };
  const std::string s(absl::StripAsciiWhitespace(text));
  if (s.empty()) return bad();
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(value) || value < 0) return bad();
  std::string unit = absl::AsciiStrToLower(std::string(end));
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
  double scale = 1;
  if (unit.empty()) scale = 1;
  else if (unit == "k") scale = 1024.0;
  else if (unit == "m") scale = 1024.0 * 1024;
  else if (unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  const double bytes = value * scale;
  if (bytes > 9.0e18) return bad();
  return static_cast<int64_t>(bytes);
}

}  // namespace tandem::kvstore
