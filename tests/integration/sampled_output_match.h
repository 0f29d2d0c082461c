// Whether two runs of one generation request produced the same output, as far as
// floating-point reproducibility allows: greedy outputs must be identical; a sampled
// output may part from the other run only at a token where
//   - both runs' next-token distributions agree (their top log-probabilities within a
//     tolerance δ), and
//   - the seeded draw there fell on the boundary between the two tokens: the uniform u of
//     UniformFromSeedStep(seed, step) (engine/runtime/sampler.h) lies in the interval of
//     cumulative probability that each run's own distribution gives its own token (within
//     kOwnDrawEpsilon), and within BoundaryEpsilon(δ, temperature) of the interval that
//     distribution gives the other run's token,
// i.e. where the logits' last bits (which vary from run to run on a GPU: float atomics,
// split-K sums) decided a draw. A divergence anywhere else (a wrong seed or step after a
// migration, a sampler that picks another token, a model that computes another
// distribution) is reported.
//
// The draw is recomputed from the listed top log-probabilities, so the request's kept set
// must lie within them: top_k between 1 and the number of logprobs asked for (top_p and
// min_p apply within it as the sampler applies them). Used by the GPU serving test;
// unit-tested on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/v1/generation.pb.h"

namespace tandem::testing {

struct OutputMatch {
  bool same = false;
  std::string why;   // when not the same: where the outputs part and why that is not allowed
  std::string note;  // when the same but parted: where, the draw and the two distributions there
};

// How a sampled request draws (SamplingParams of the request; first_step: the output
// position of its first token, 0 unless it resumed after tokens generated elsewhere).
struct SampledDraw {
  uint64_t seed = 0;
  int64_t first_step = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// The draw of a request: nullopt when it is greedy; a sampled request without a seed has
// no reproducible draw and is given seed 0 (a parting then cannot match, as it should not).
std::optional<SampledDraw> DrawOf(const v1::GenerateRequest& request);

// How far the cumulative-probability boundary between two tokens can move when every
// log-probability moves by at most `tolerance`, at `temperature`: the boundary is S/(S+R),
// S the weight up to it and R the rest of the kept set; multiplying each weight
// exp(logprob / T) by at most e^(±δ/T) moves it by at most B(1-B)·2δ/T <= δ/(2T).
double BoundaryEpsilon(float tolerance, float temperature);
// A run's own token lies in its own interval up to the rounding of the float log-
// probabilities it reports and the sampler's float weights (relative errors near 1e-6).
inline constexpr double kOwnDrawEpsilon = 1e-4;

// got / want: the tokens and the log-probabilities (one per token, or none) of two runs.
// `sampled`: the request's draw (nullopt: greedy). At a parting, want's log-probabilities
// are needed; got's are checked too when present (a run without them, e.g. one whose
// tokens were chosen on the GPU, is checked against want's distribution alone). A token
// missing from one run's top list counts as agreeing when it lies within `tolerance` of
// that list's last entry (a swap at the list's edge).
//
// The tolerance δ, 2e-3: correct runs differ where a value of the GPU's bf16 KV cache or
// bf16 GEMM input sits at a rounding midpoint and the run's float32 sum order decides it:
// one bf16 step, 2^-8 = 3.9e-3 of that value, diluted in the logits; 2e-3 (half a bf16
// step) bounds what such flips give in logits of order one, and at temperature 0.8 it
// lets a boundary move by 1.25e-3.
OutputMatch MatchOutputs(const std::optional<SampledDraw>& sampled, const std::vector<int32_t>& got_tokens,
                         const std::vector<v1::TokenLogprob>& got_logprobs, const std::vector<int32_t>& want_tokens,
                         const std::vector<v1::TokenLogprob>& want_logprobs, float tolerance = 2e-3f);

}  // namespace tandem::testing
