// Byte sizes on the command line: "1073741824", "512M", "4G", "1.5GiB", "64k".
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::kvstore {

// A non-negative number with an optional binary unit: K, M, G, T (powers of 1024), with
// or without "i" and "B" ("KiB", "MB" and "M" all mean 1024^2 bytes), case-insensitive.
// INVALID_ARGUMENT naming `what` for anything else.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text, const std::string& what);

}  // namespace tandem::kvstore
