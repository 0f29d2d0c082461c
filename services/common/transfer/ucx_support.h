// Small helpers of the UCX transfer engine (internal to services/common/transfer).
#pragma once

#include <ucs/type/status.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem::transfer::internal {

// A UCX status as an absl::Status: peer and link failures are UNAVAILABLE, UCS_ERR_CANCELED
// is CANCELLED, bad parameters INVALID_ARGUMENT, and so on; `what` prefixes the message.
absl::Status FromUcs(ucs_status_t status, std::string_view what);

// `what`: strerror(errno).
std::string ErrnoMessage(std::string_view what);

// Copies n bytes into a peer's memory mapped in this process (UCX shared memory), with
// streaming (non-temporal) stores where that is faster than memcpy. Call StoreFence()
// after the last copy of a batch, before reporting it complete.
void CopyToMapped(char* dst, const void* src, size_t n);
void StoreFence();

// Whether a UCX_TLS value lets tcp in: "" (UCX's default), "all", a list naming tcp, or an
// exclusion list ("^...") that does not name it.
bool TlsIncludesTcp(const std::string& tls);

}  // namespace tandem::transfer::internal
