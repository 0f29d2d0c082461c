#include "engine/runtime/draft_policy.h"

namespace tandem {

int DraftPolicy::BucketOf(int64_t decoding) {
  if (decoding <= 1) return 0;
  if (decoding <= 4) return 1;
  if (decoding <= 16) return 2;
  if (decoding <= 64) return 3;
  if (decoding <= 256) return 4;
  return 5;
}

bool DraftPolicy::Drafts(int64_t decoding) {
  Bucket& b = buckets_[BucketOf(decoding)];
  const Arm& off = b.arms[0];
  const Arm& on = b.arms[1];
  // Measure both first: drafting, then not.
  if (on.steps < options_.warmup_steps) return true;
  if (off.steps < options_.warmup_steps) return false;
  const bool best = on.rate >= off.rate;
  const int64_t phase = b.decisions++ % options_.explore_every;
  return phase < options_.explore_every - options_.explore_steps ? best : !best;
}

void DraftPolicy::Record(int64_t decoding, bool drafted, int64_t tokens, double seconds) {
  if (!(seconds > 0.0) || tokens <= 0) return;
  Arm& a = buckets_[BucketOf(decoding)].arms[drafted ? 1 : 0];
  const double rate = static_cast<double>(tokens) / seconds;
  a.rate = a.steps == 0 ? rate : a.rate + options_.smoothing * (rate - a.rate);
  ++a.steps;
}

double DraftPolicy::Rate(int64_t decoding, bool drafted) const {
  return buckets_[BucketOf(decoding)].arms[drafted ? 1 : 0].rate;
}

}  // namespace tandem
