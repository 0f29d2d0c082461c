#include "services/security/token_bucket.h"

#include <algorithm>
#include <cmath>

namespace tandem::security {

TokenBucket::TokenBucket(double rate, double burst, Clock::time_point now)
    : rate_(rate), burst_(std::max(burst, 1.0)), tokens_(std::max(burst, 1.0)), last_(now) {}

void TokenBucket::Refill(Clock::time_point now) {
  if (now <= last_) return;
  const double seconds = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min(burst_, tokens_ + seconds * rate_);
  last_ = now;
}

TokenBucket::Clock::duration TokenBucket::TryTake(Clock::time_point now) {
  Refill(now);
  if (tokens_ >= 1.0) {
    tokens_ -= 1.0;
    return Clock::duration::zero();
  }
  const double wait_s = (1.0 - tokens_) / rate_;
  const auto wait = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  return std::max(wait, Clock::duration(1));
}

}  // namespace tandem::security
