#include "services/security/cluster_token.h"

#include <fstream>
#include <sstream>

#include <cctype>

#include "absl/strings/str_cat.h"

namespace tandem::security {

absl::StatusOr<std::string> ValidateClusterToken(std::string_view token, const std::string& origin) {
  std::string_view t = token;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  if (t.size() < kMinClusterTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-token-file: ", origin, ": the token has ", t.size(),
                                                   " characters; at least ", kMinClusterTokenLength,
                                                   " are required (e.g. openssl rand -hex 32)"));
  }
  for (char c : t) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-token-file: ", origin,
                                                     ": the token must be printable ASCII without spaces"));
    }
  }
  return std::string(t);
}

absl::StatusOr<std::string> ReadClusterTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--cluster-token-file: cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ValidateClusterToken(ss.str(), path);
}

}  // namespace tandem::security
