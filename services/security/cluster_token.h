// The shared cluster token (--cluster-token-file): the fallback authentication of internal
// traffic where mutual TLS is not set up. Every internal client sends it as call metadata
// (kClusterTokenMetadataKey); every internal server checks it, in constant time, before
// any handler runs, and refuses a call without it or with another one as UNAUTHENTICATED.
//
// Note: a token over a plaintext channel authenticates the caller but does not hide the
// token from someone who can read the network; it is meant for networks that are private
// already. Mutual TLS is the way where they are not.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::security {

inline constexpr char kClusterTokenMetadataKey[] = "x-tandem-cluster-token";
inline constexpr size_t kMinClusterTokenLength = 16;

// Reads the token: the file's content without surrounding whitespace, at least
// kMinClusterTokenLength printable ASCII characters without spaces (gRPC metadata values
// must be printable). Errors (naming --cluster-token-file and the path): NOT_FOUND when
// unreadable, INVALID_ARGUMENT when too short or not printable.
absl::StatusOr<std::string> ReadClusterTokenFile(const std::string& path);

// The same checks on a token given directly (the file's trimmed content).
absl::StatusOr<std::string> ValidateClusterToken(std::string_view token, const std::string& origin);

}  // namespace tandem::security
