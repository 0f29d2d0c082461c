#include "services/security/pem_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem::security {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat(flag, ": cannot read ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " holds no PEM block (-----BEGIN ...)"));
  }
  return pem;
}

}  // namespace tandem::security
