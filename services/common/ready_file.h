// The ready file: written once a service is ready, JSON with its bound addresses, so
// that launchers and tests never guess ports (docs/design.md §1, --ready-file).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::service {

// Writes `contents` (pretty JSON and a newline) to `path` atomically: into a temporary
// file in the same directory, flushed to disk, then renamed over `path`. A reader
// polling `path` sees either no file (or the previous one) or the complete new file,
// never a partial one. Errors: INVALID_ARGUMENT for an empty path, and the errno-derived
// status (NOT_FOUND for a missing directory, PERMISSION_DENIED, ...) naming the path for
// a failed create/write/rename; the temporary file is removed on failure.
absl::Status WriteReadyFile(const std::string& path, const nlohmann::json& contents);

}  // namespace tandem::service
