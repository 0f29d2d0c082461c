// Shared by the sampler's tests: random logits rows and the sampler's kept set (sampler.h,
// step 4) written the obvious way, with a full sort, as the reference the fast bucketed
// selection is checked against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"

namespace tandem::sampler_test {

inline std::vector<float> RandomLogits(size_t vocab, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(rng);
  return logits;
}

// Sample on a copy of `logits` (Sample penalizes them in place).
inline SampledToken SampleCopy(Sampler& sampler, std::vector<float> logits,
                               const SamplingParams& p, uint64_t seed, int64_t step,
                               std::span<const int32_t> prompt = {},
                               std::span<const int32_t> output = {}) {
  return sampler.Sample(logits, p, seed, step, prompt, output);
}

// Every combination of the given truncation settings, for tests that sweep them.
inline std::vector<SamplingParams> TruncationGrid(const std::vector<float>& temperatures,
                                                  const std::vector<int32_t>& top_ks,
                                                  const std::vector<float>& top_ps,
                                                  const std::vector<float>& min_ps) {
  std::vector<SamplingParams> grid;
  for (const float t : temperatures) {
    for (const int32_t k : top_ks) {
      for (const float top_p : top_ps) {
        for (const float min_p : min_ps) {
          SamplingParams p;
          p.temperature = t;
          p.top_k = k;
          p.top_p = top_p;
          p.min_p = min_p;
          grid.push_back(p);
        }
      }
    }
  }
  return grid;
}

// What Sample draws from for non-greedy params, given already-penalized logits.
struct ReferenceKeptSet {
  std::vector<int32_t> ids;    // the kept tokens, in canonical order
  std::vector<bool> is_kept;   // [vocab]
  std::vector<float> weights;  // [vocab] SamplerExp((logit - max) / T), before truncation
  double mass = 0.0;           // the weight of `ids`

  // The probability of each vocabulary id under Sample's draw.
  std::vector<double> Probabilities() const {
    std::vector<double> p(weights.size(), 0.0);
    for (const int32_t id : ids) p[id] = weights[id] / mass;
    return p;
  }
};

inline ReferenceKeptSet ReferenceKept(const std::vector<float>& logits, const SamplingParams& p) {
  ReferenceKeptSet kept;
  const float max = *std::max_element(logits.begin(), logits.end());
  const float inv_t = 1.0f / p.temperature;
  kept.weights.resize(logits.size());
  std::vector<int32_t>& order = kept.ids;
  for (size_t i = 0; i < logits.size(); ++i) {
    kept.weights[i] = SamplerExp((logits[i] - max) * inv_t);
    if (kept.weights[i] > 0.0f) order.push_back(static_cast<int32_t>(i));
  }
  const std::vector<float>& w = kept.weights;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  double total = 0.0;
  for (const int32_t id : order) total += w[id];
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t j = 0; j < order.size(); ++j) {
      cum += w[order[j]];
      if (cum >= static_cast<double>(p.top_p) * total) {
        order.resize(j + 1);
        break;
      }
    }
  }
  std::erase_if(order, [&](int32_t id) { return w[id] < p.min_p; });
  kept.is_kept.assign(logits.size(), false);
  for (const int32_t id : order) {
    kept.is_kept[id] = true;
    kept.mass += w[id];
  }
  return kept;
}

}  // namespace tandem::sampler_test
