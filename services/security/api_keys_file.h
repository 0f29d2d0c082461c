// The --api-keys-file format, one key per line:
//
//   # comments and blank lines are ignored
//   KEY [name=NAME] [rps=N] [burst=N]
//
// KEY: 16 or more printable ASCII characters without spaces (e.g. openssl rand -hex 24).
// name: a label for logs (default: "key-<line number>"); rps: requests per second the key
// may start, a number > 0, absent or 0 = unlimited; burst: requests it may start at once
// (default max(1, rps)). Fields are separated by spaces or tabs; keys and names must be
// unique.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::security {

struct ApiKey {
  std::string key;
  std::string name;
  double rps = 0;    // 0: unlimited
  double burst = 0;  // with rps > 0: the bucket size
};

// Parses a file's text. Errors: INVALID_ARGUMENT naming `origin` (the path), the line and
// the field; the key itself is never quoted in a message.
absl::StatusOr<std::vector<ApiKey>> ParseApiKeys(std::string_view text, const std::string& origin);

// Reads and parses the file. Errors: NOT_FOUND when it cannot be read, INVALID_ARGUMENT
// when it holds no key or a bad line.
absl::StatusOr<std::vector<ApiKey>> LoadApiKeysFile(const std::string& path);

}  // namespace tandem::security
