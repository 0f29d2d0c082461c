#include "services/security/secret_compare.h"

#include <cstddef>

namespace tandem::security {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is looked at whatever the contents; the lengths
  // themselves are not secret (every key has its own).
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace tandem::security
