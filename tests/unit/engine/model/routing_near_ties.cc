#include "tests/unit/engine/model/routing_near_ties.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::testing {

DeepseekForwardOptions RoutingHooks(const RoutingOverrides* overrides, RecordedRoutings* record) {
  DeepseekForwardOptions o;
  o.after_routing = [overrides, record](int64_t layer, const cpu::MoeRoutingParams& routing) {
    const int64_t rows = routing.num_tokens, experts = routing.num_experts, k = routing.top_k;
    if (record != nullptr) {
      RecordedRouting& r = (*record)[layer];
      r.params = routing;
      r.params.logits = nullptr;
      r.params.expert_ids = nullptr;
      r.params.weights = nullptr;
      r.logits.assign(routing.logits, routing.logits + rows * experts);
      r.ids.assign(routing.expert_ids, routing.expert_ids + rows * k);
      r.weights.assign(routing.weights, routing.weights + rows * k);
    }
    if (overrides == nullptr) return;
    for (auto it = overrides->lower_bound({layer, 0}); it != overrides->end() && it->first.first == layer; ++it) {
      const int64_t row = it->first.second;
      if (row >= rows) continue;
      std::memcpy(routing.expert_ids + row * k, it->second.ids.data(), k * sizeof(int32_t));
      std::memcpy(routing.weights + row * k, it->second.weights.data(), k * sizeof(float));
    }
  };
  return o;
}

float LogitStep(const float* logits, int64_t n) {
  float mag = 1e-30f;
  for (int64_t i = 0; i < n; ++i) mag = std::max(mag, std::abs(logits[i]));
  return std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(mag))) - 7);
}

std::vector<float> RoutingWeights(const cpu::MoeRoutingParams& params, const float* logits,
                                  const std::vector<int32_t>& ids) {
  const int64_t e = params.num_experts;
  std::vector<double> scores(static_cast<size_t>(e));
  if (params.scoring == cpu::MoeScoring::kSoftmax) {
    const double top = *std::max_element(logits, logits + e);
    double sum = 0;
    for (int64_t i = 0; i < e; ++i) sum += scores[i] = std::exp(static_cast<double>(logits[i]) - top);
    for (double& s : scores) s /= sum;
  } else {
    for (int64_t i = 0; i < e; ++i) scores[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
  }
  std::vector<float> w(ids.size());
  double sum = 0;
  for (size_t k = 0; k < ids.size(); ++k) sum += scores[ids[k]];
  const bool normalize = params.normalize && ids.size() > 1;
  for (size_t k = 0; k < ids.size(); ++k) {
    double v = scores[ids[k]];
    if (normalize) v /= sum + 1e-20;
    if (!normalize || params.scale_normalized) v *= params.routed_scaling_factor;
    w[k] = static_cast<float>(v);
  }
  return w;
}

std::vector<RoutingChoice> NearTieAlternatives(const RecordedRouting& layer, int64_t row) {
  const int64_t e = layer.params.num_experts, k = layer.params.top_k;
  const float* logits = layer.logits.data() + row * e;
  const int32_t* chosen = layer.ids.data() + row * k;
  std::vector<int32_t> sorted_chosen(chosen, chosen + k);
  std::sort(sorted_chosen.begin(), sorted_chosen.end());
  const float step = LogitStep(logits, e);
  std::vector<RoutingChoice> out;
  std::vector<std::vector<int32_t>> seen;
  for (int64_t s = 0; s < k; ++s) {
    for (int32_t u = 0; u < e; ++u) {
      if (std::binary_search(sorted_chosen.begin(), sorted_chosen.end(), u)) continue;
      std::vector<float> moved(logits, logits + e);
      moved[chosen[s]] -= step;
      moved[u] += step;
      std::vector<int32_t> ids(static_cast<size_t>(k));
      std::vector<float> unused(static_cast<size_t>(k));
      cpu::MoeRoutingParams p = layer.params;
      p.logits = moved.data();
      p.num_tokens = 1;
      p.expert_ids = ids.data();
      p.weights = unused.data();
      cpu::RouteMoe(p);
      std::vector<int32_t> key = ids;
      std::sort(key.begin(), key.end());
      if (key == sorted_chosen || std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      out.push_back({.ids = ids, .weights = RoutingWeights(layer.params, logits, ids)});
    }
  }
  return out;
}

}  // namespace tandem::testing
