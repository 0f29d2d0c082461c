// Chooses a sequence's next token from its logits (CPU). One Sampler per engine thread;
// it keeps scratch buffers between calls, so it is not thread-safe, but no call depends on
// an earlier one: the result is a function of (logits, params, seed, step, token history)
// only, so a seeded request samples the same tokens alone or in any batch.
//
// What Sample does, in order:
//   1. Penalties (ApplyPenalties), in place on `logits`:
//      - repetition_penalty r over the distinct tokens of prompt + output:
//        logit > 0 -> logit / r, otherwise logit * r (Hugging Face, vLLM);
//      - presence and frequency penalties over the output tokens:
//        logit -= presence * [count > 0] + frequency * count.
//   2. Log-probabilities: log_softmax of the penalized logits, at temperature 1 and before
//      any truncation. SampledToken::logprob and top_logprobs come from it. (vLLM's
//      default "raw_logprobs" mode uses the logits before penalties instead.)
//   3. temperature < kGreedyTemperature (0 included): the argmax of the penalized logits,
//      ties to the lowest id (one vectorized pass, plus one for the log-normalizer);
//      top-k/top-p/min-p do not apply.
//   4. Otherwise weights exp((logit - max) / temperature) (SamplerExp; weights below
//      e^-87 are 0 and such tokens are never drawn), then, each on what the previous
//      left:
//      - top-k: the k first tokens in canonical order;
//      - top-p: the shortest canonical prefix whose probability mass (relative to what
//        top-k left) is >= top_p;
//      - min-p: drop tokens whose probability is < min_p * the largest probability;
//      then one uniform u in [0, 1) from UniformFromSeedStep(seed, step) picks the first
//      token, in canonical order, at which the cumulative probability of the kept tokens
//      exceeds u times their total (inverse CDF).
//   Canonical order: penalized logit descending, then id ascending (that is probability
//   descending, ties to the lower id).
//
// Cost: O(vocab + history) per call, no sort of the vocabulary: tokens are bucketed by
// weight (about 1024 buckets over the range of the logits, at least 64 per nat),
// prefixes are located on the bucket histogram, and only the bucket a boundary falls in
// is examined token by token (nth_element bisection). About 0.5 ms for 129,280 logits
// with top_p 0.9 (sampler_test's Speed prints the figures).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/runtime/sampling_params.h"

namespace tandem {

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;  // of `token`, from the penalized log_softmax (step 2 above)
  // The params.logprobs (at most vocab) most likely tokens under the same distribution,
  // in canonical order: (id, logprob).
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// exp(x) for x <= 0 as the sampler computes it: a polynomial (Cephes' expf) within 2 ulp
// of exp, 0 below -87, giving the same bits in its vector and scalar forms. Exposed for
// reference implementations and tests.
float SamplerExp(float x);

// A uniform number in [0, 1) with 53 random bits, a pure function of (seed, step)
// (SplitMix64 mixing; no state). Exposed so that other backends can reproduce Sample.
double UniformFromSeedStep(uint64_t seed, int64_t step);

class Sampler {
 public:
  // logits: one float per vocabulary id, modified in place (penalties). Entries may be
  // -inf (disallowed tokens) but not NaN or +inf, and at least one must be finite
  // (checked). params: validated (sampling_params.h). seed: params.seed when set, else the
  // request's engine-chosen seed. step: the output position of the token being sampled
  // (0 for the first generated token), so that recomputation after preemption samples
  // the same token again. prompt_tokens / output_tokens: the sequence's history, every id
  // in [0, vocab) (checked).
  SampledToken Sample(std::span<float> logits, const SamplingParams& params, uint64_t seed,
                      int64_t step, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens);

  // Step 1 on its own (what Sample applies first).
  void ApplyPenalties(std::span<float> logits, const SamplingParams& params,
                      std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens);

 private:
  // A canonical prefix of the candidates: every bucket before `bucket`, then the first
  // `in_bucket` members of `bucket` in canonical order.
  struct Cut {
    size_t bucket = 0;
    size_t in_bucket = 0;
  };
  struct Selection {
    size_t length = 0;  // candidates in the prefix
    double mass = 0.0;  // their weight
    int32_t last = -1;  // the last of them in canonical order
  };

  // Marks of tokens seen in the current call: seen_[id] == epoch_ (avoids clearing).
  uint32_t NextEpoch(size_t vocab);
  // Weights, buckets and the bucket histogram of a non-greedy call (see sampler.cc).
  void BuildHistogram(const float* logits, size_t vocab, float max, float min_finite,
                      float inv_t, float min_p);
  Cut Locate(size_t length) const;
  // Puts the canonical keys of bucket `cut.bucket`'s first `cut.in_bucket` members into
  // keys_[0, in_bucket), unordered, or in canonical order when it returns true.
  bool CollectBucket(const float* logits, Cut cut);
  double PrefixMass(const float* logits, size_t length);
  // The shortest canonical prefix, within the first `limit` candidates, whose weight
  // reaches `target` (> target when strict, >= otherwise); the whole `limit` prefix when
  // rounding keeps every one short of it.
  Selection SelectByMass(const float* logits, double target, bool strict, size_t limit);
  // SelectByMass within keys_[0, n) (`sorted`: already in canonical order), after a
  // prefix weighing `acc`: reorders keys_ so that its k first entries are the k first in
  // canonical order, the k-th at keys_[k - 1], and returns k (n when no prefix reaches
  // the target); *mass gets acc plus their weight.
  size_t SelectPrefix(size_t n, double target, bool strict, bool sorted, double acc,
                      double* mass);

  std::vector<uint32_t> seen_;    // [vocab]
  std::vector<uint32_t> counts_;  // [vocab], valid where seen_ == epoch_
  uint32_t epoch_ = 0;
  std::vector<float> weights_;    // [vocab] exp((logit - max) / temperature)
  std::vector<uint16_t> bucket_;  // [vocab] bucket of each token; kNoBucket for weight 0
  std::vector<uint32_t> bucket_count_;  // [kNumBuckets]
  std::vector<double> bucket_mass_;     // [kNumBuckets]
  size_t num_candidates_ = 0;  // tokens of positive weight
  size_t min_p_count_ = 0;     // ... of weight >= min_p
  double min_p_mass_ = 0.0;
  double total_mass_ = 0.0;
  std::vector<uint64_t> keys_;  // scratch: ~ordered(logit) << 32 | id
};

// Sets the logits of `ids` to -inf: a helper for the engine to keep EOS and stop tokens
// from being sampled while fewer than min_tokens tokens were generated (as vLLM does).
void SuppressTokens(std::span<float> logits, std::span<const int32_t> ids);

}  // namespace tandem
