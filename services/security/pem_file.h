// Reads the PEM files named by the TLS flags, with errors that name the flag.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem::security {

// The contents of `path`, which must hold at least one PEM block ("-----BEGIN ").
// Errors: NOT_FOUND / PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT when it is
// empty or not PEM; each message names `flag` ("--tls-cert") and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

}  // namespace tandem::security
