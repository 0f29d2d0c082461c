// Small helpers of the UCX transfer engine (internal to services/common/transfer).
#pragma once

#include <ucs/type/status.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// The mapping of this process that holds [p, p + length), from /proc/self/maps: OK only
// when one shared, writable mapping (a shared-memory segment UCX attached) covers the whole
// range. This is the extent a direct copy into a peer's memory may use: ucp_rkey_ptr only
// adds an offset to the address it is given and checks nothing, so a descriptor claiming
// more than the peer registered would otherwise send copies past the segment.
// INVALID_ARGUMENT (saying what is mapped there) otherwise.
absl::Status CheckSharedMapping(const void* p, uint64_t length);
// The same over a /proc/self/maps text (tests).
absl::Status CheckSharedMappingIn(std::string_view maps, uintptr_t p, uint64_t length);

// Whether a UCX_TLS value lets tcp in: "" (UCX's default), "all", a list naming tcp, or an
// exclusion list ("^...") that does not name it.
bool TlsIncludesTcp(const std::string& tls);

}  // namespace tandem::transfer::internal
