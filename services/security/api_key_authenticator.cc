#include "services/security/api_key_authenticator.h"

#include <cmath>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "services/security/secret_compare.h"

namespace tandem::security {
namespace {

constexpr char kMissing[] =
    "this API requires a key: send the metadata 'authorization: Bearer KEY' (tandem generate --api-key)";
constexpr char kWrong[] = "unknown API key";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// `s` starts with `lower_prefix` (lower case), ignoring case.
bool StartsWithIgnoreCase(std::string_view s, std::string_view lower_prefix) {
  if (s.size() < lower_prefix.size()) return false;
  for (size_t i = 0; i < lower_prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != lower_prefix[i]) return false;
  }
  return true;
}

}  // namespace

ApiKeyAuthenticator::ApiKeyAuthenticator(std::vector<ApiKey> keys, Clock clock) : clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return TokenBucket::Clock::now(); };
  const auto now = clock_();
  for (ApiKey& k : keys) {
    Entry e;
    if (k.rps > 0) e.bucket = std::make_unique<TokenBucket>(k.rps, k.burst, now);
    e.key = std::move(k);
    keys_.push_back(std::move(e));
  }
}

const ApiKeyAuthenticator::Entry* ApiKeyAuthenticator::Find(std::string_view authorization) const {
  authorization = Trim(authorization);
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() || !StartsWithIgnoreCase(authorization, kScheme)) return nullptr;
  const std::string_view presented = Trim(authorization.substr(kScheme.size()));
  // Every key is compared, in constant time each, so the time says nothing of which
  // (or how much of one) matched.
  const Entry* found = nullptr;
  for (const Entry& e : keys_) {
    if (ConstantTimeEquals(presented, e.key.key) && found == nullptr) found = &e;
  }
  return found;
}

absl::Status ApiKeyAuthenticator::Refusal(std::string_view authorization) {
  return absl::UnauthenticatedError(Trim(authorization).empty() ? kMissing : kWrong);
}

ApiKeyDecision ApiKeyAuthenticator::Authenticate(std::string_view authorization) const {
  ApiKeyDecision d;
  const Entry* e = Find(authorization);
  if (e == nullptr) {
    d.status = Refusal(authorization);
  } else {
    d.key_name = e->key.name;
  }
  return d;
}

ApiKeyDecision ApiKeyAuthenticator::Authorize(std::string_view authorization) {
  ApiKeyDecision d;
  const Entry* e = Find(authorization);
  if (e == nullptr) {
    d.status = Refusal(authorization);
    return d;
  }
  d.key_name = e->key.name;
  if (e->bucket == nullptr) return d;
  TokenBucket::Clock::duration wait;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wait = e->bucket->TryTake(clock_());
  }
  if (wait == TokenBucket::Clock::duration::zero()) return d;
  d.retry_after = std::chrono::milliseconds(static_cast<int64_t>(
      std::ceil(std::chrono::duration<double, std::milli>(wait).count())));
  d.status = absl::ResourceExhaustedError(absl::StrCat("API key '", e->key.name, "' is over its rate of ", e->key.rps,
                                                       " requests/s; retry in ", d.retry_after.count(), " ms"));
  return d;
}

}  // namespace tandem::security
