// Reads the PEM files named by the TLS flags, with errors that name the flag.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem::security {

// The contents of `path`, which must hold at least one PEM block ("-----BEGIN ").
// Errors: NOT_FOUND / PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT when it is
// empty or not PEM; each message names `flag` ("--tls-cert") and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& flag);

// Whether PEM `key` is the private key of the first certificate in PEM `cert` (read from
// the files named by `cert_flag` and `key_flag`): INVALID_ARGUMENT naming both flags when
// either does not parse or the key belongs to another certificate. Checked at startup, so
// that a mismatched pair is a clear error rather than a port that cannot listen.
absl::Status CheckKeyPair(const std::string& cert, const std::string& cert_flag, const std::string& key,
                          const std::string& key_flag);

}  // namespace tandem::security
