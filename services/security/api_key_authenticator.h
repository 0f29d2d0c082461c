// API keys of the public API (--api-keys-file, api_keys_file.h): which key a request
// carries (authorization: Bearer KEY) and whether its rate allows it now. Transport
// neutral: the gRPC entry (grpc_api_key_check.h), the admin pages (http_api_key_check.h)
// and the HTTP front end turn a decision into their own status. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "services/security/api_keys_file.h"
#include "services/security/token_bucket.h"

namespace tandem::security {

struct ApiKeyDecision {
  // OK; UNAUTHENTICATED (no key, not a Bearer header, unknown key); RESOURCE_EXHAUSTED
  // (the key is over its rate: retry after `retry_after`).
  absl::Status status;
  std::chrono::milliseconds retry_after{0};
  std::string key_name;  // the key's name when it was recognized
};

class ApiKeyAuthenticator {
 public:
  using Clock = std::function<TokenBucket::Clock::time_point()>;

  // `clock` defaults to the steady clock.
  explicit ApiKeyAuthenticator(std::vector<ApiKey> keys, Clock clock = nullptr);

  // For a request: identifies the key in `authorization` (the header's value, "Bearer
  // KEY") and takes one request from its rate.
  ApiKeyDecision Authorize(std::string_view authorization);
  // Identifies the key only (pages that are read, not served work: no rate taken).
  ApiKeyDecision Authenticate(std::string_view authorization) const;

  size_t size() const { return keys_.size(); }

 private:
  struct Entry {
    ApiKey key;
    std::unique_ptr<TokenBucket> bucket;  // null: unlimited
  };
  // The entry whose key `authorization` carries, or null.
  const Entry* Find(std::string_view authorization) const;
  static absl::Status Refusal(std::string_view authorization);

  Clock clock_;
  std::vector<Entry> keys_;
  std::mutex mu_;  // the buckets
};

}  // namespace tandem::security
