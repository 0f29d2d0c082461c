// A token bucket: `rate` tokens a second up to `burst` held; one request takes one. The
// clock is the caller's (time points passed in), so tests step it by hand.
#pragma once

#include <chrono>

namespace tandem::security {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts full. `rate` > 0, `burst` >= 1.
  TokenBucket(double rate, double burst, Clock::time_point now);

  // Takes a token and returns zero if one is there at `now`; otherwise takes nothing and
  // returns how long until one will be (> 0). Time going backwards adds nothing.
  Clock::duration TryTake(Clock::time_point now);

 private:
  void Refill(Clock::time_point now);

  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

}  // namespace tandem::security
