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
//
// Verify is Sample's counterpart for speculative decoding (docs/speculative-decoding.md):
// it checks a greedy draft token against the same distribution and returns a token
// distributed exactly as Sample's.
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

// Independent uniform draws for one (seed, step): Sample's, and Verify's two.
enum class SeedStream : uint64_t {
  kSample = 0,       // Sample's inverse-CDF draw: UniformFromSeedStep, bit for bit
  kDraftAccept = 1,  // Verify's acceptance test of the draft
  kDraftRedraw = 2,  // Verify's draw of the corrected token after a refusal
};

// UniformFromSeedStep with the stream mixed into the step's hash input (the mix of
// kSample is 0, so that stream is UniformFromSeedStep itself). Draws of different
// (step, stream) pairs of one seed never share a hash input for steps below 2^32.
double UniformFromSeedStream(uint64_t seed, int64_t step, SeedStream stream);

// The result of Verify. accepted == (sampled.token == draft): a refused draft is never
// the corrected token.
struct VerifiedToken {
  SampledToken sampled;
  bool accepted = false;
};

// The drafting side's choice from a draft model's logits row: the argmax (ties to the
// lowest id, as Sample's greedy) and its softmax probability at temperature 1, the
// draft's confidence. No penalties or sampling parameters apply: drafts are greedy.
struct DraftChoice {
  int32_t token = -1;
  float confidence = 0.0f;
};
// logits: as Sample's (no NaN or +inf, at least one finite; checked). O(vocab).
DraftChoice GreedyDraft(std::span<const float> logits);

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

  // Speculative decoding's acceptance step (Leviathan et al., Chen et al., with a one-hot
  // draft distribution): the token at output position `step` given that the drafter
  // proposed `draft`, which must be in [0, vocab) (checked: the engine passes its own
  // drafts). Arguments as Sample's; sampled.logprob and top_logprobs are exactly what
  // Sample gives for the returned token (the same penalized log_softmax).
  //   - Greedy params: the token is Sample's argmax; the draft is accepted iff it is
  //     that token. The output is exactly the non-speculative one.
  //   - Otherwise, with p the distribution Sample draws from (its kept set, weights
  //     normalized over it; p(draft) = 0 outside it): accepted iff u_a < p(draft), u_a
  //     from SeedStream::kDraftAccept; then the token is the draft. When refused, the
  //     token is drawn from p without the draft, renormalized, by the inverse CDF in id
  //     order (ascending ids of the kept set) at u_r * their mass, u_r from
  //     SeedStream::kDraftRedraw. If rounding left no mass besides the draft's, it is
  //     accepted. P(token = x) = p(x) for every x, as with Sample (not the same token as
  //     Sample's for a seed: another draw).
  // Cost: Sample's, plus a scan of the histogram's bucket array when truncation applies
  // (the last kept token, which decides membership in the kept set) and, on a refusal,
  // one pass over the weights (the mass without the draft, per block of 256 ids) and one
  // block (the draw): O(vocab + history), no sort. About 1.4x Sample's time on a refusal
  // for 129,280 logits (0.48 vs 0.34 ms on a 2-core x86-64-v3 build machine;
  // sampler_verify_test's Speed prints the figures).
  VerifiedToken Verify(std::span<float> logits, const SamplingParams& params, uint64_t seed,
                       int64_t step, std::span<const int32_t> prompt_tokens,
                       std::span<const int32_t> output_tokens, int32_t draft);

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

  // What Sample and Verify compute before choosing: steps 1-2, then the greedy token or
  // step 4's kept set.
  struct Target {
    double log_z = 0.0;       // log sum exp(penalized logits): the log_softmax normalizer
    int32_t argmax = -1;      // greedy params only
    size_t kept = 0;          // otherwise: the kept set is the first `kept` candidates
    double kept_mass = 0.0;   // ... and weighs this (weights_ relative to the max's 1)
  };
  Target Prepare(std::span<float> logits, const SamplingParams& params,
                 std::span<const int32_t> prompt_tokens, std::span<const int32_t> output_tokens);
  // Verify's choice for non-greedy params, after Prepare.
  int32_t VerifySampled(const float* logits, const Target& target, uint64_t seed, int64_t step,
                        int32_t draft);
  // The canonical key of the n-th candidate in canonical order (1 <= n <= candidates).
  uint64_t NthKey(const float* logits, size_t n);

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
  std::vector<double> block_mass_;  // scratch of Verify's redraw: mass per block of ids
};

// Sets the logits of `ids` to -inf: a helper for the engine to keep EOS and stop tokens
// from being sampled while fewer than min_tokens tokens were generated (as vLLM does).
void SuppressTokens(std::span<float> logits, std::span<const int32_t> ids);

}  // namespace tandem
