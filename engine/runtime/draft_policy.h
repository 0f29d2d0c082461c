// When drafting pays (docs/speculative-decoding.md). A verify step computes 1 + k tokens per
// sequence: where steps are bound by reading the weights (a GPU at small batches) that
// costs little more than a plain step and every accepted draft is a token for free; where
// they are bound by arithmetic (large batches, a CPU) it can cost more than the drafts
// give. The policy measures both on the engine's own decode steps, per batch-size bucket:
// generated tokens per second of steps that verified drafts and of steps that did not, as
// moving averages. It drafts where drafting measured faster and now and then tries the
// other way for a few steps, so that a change of load or acceptance shows. Whether a step
// drafts never changes a request's tokens (each position's own draw decides a draft).
//
// Pure bookkeeping on the engine thread: no clock of its own (the caller measures).
#pragma once

#include <array>
#include <cstdint>

namespace tandem {

struct DraftPolicyOptions {
  // Steps of each kind a bucket measures before it chooses.
  int32_t warmup_steps = 8;
  // Then, every `explore_every` steps of a bucket, `explore_steps` steps the other way.
  int32_t explore_every = 256;
  int32_t explore_steps = 8;
  double smoothing = 0.1;  // weight of a new measurement in the moving average
};

class DraftPolicy {
 public:
  explicit DraftPolicy(DraftPolicyOptions options = {}) : options_(options) {}

  // Whether the sequences of a batch of `decoding` sequences draft for their next step.
  bool Drafts(int64_t decoding);
  // A decode step of `decoding` sequences that verified drafts (`drafted`) or not: the
  // tokens it generated and the seconds it took.
  void Record(int64_t decoding, bool drafted, int64_t tokens, double seconds);

  // The moving average of tokens per second of a bucket's steps with and without drafts
  // (0: not measured yet), for tests and stats.
  double Rate(int64_t decoding, bool drafted) const;

 private:
  static constexpr int kBuckets = 6;  // 1, 2-4, 5-16, 17-64, 65-256, more
  struct Arm {
    double rate = 0.0;
    int64_t steps = 0;
  };
  struct Bucket {
    Arm arms[2];  // [0]: without drafts, [1]: with
    int64_t decisions = 0;
  };
  static int BucketOf(int64_t decoding);

  DraftPolicyOptions options_;
  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace tandem
