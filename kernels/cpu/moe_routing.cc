#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/norm_rope_act.h"

namespace tandem::cpu {
namespace {

// Indices of the k largest values (ties: lower index first), in descending order.
void TopK(const float* v, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

void RouteMoe(const MoeRoutingParams& p) {
  TANDEM_CHECK(p.num_experts % p.num_groups == 0);
  TANDEM_CHECK_LE(p.top_k, p.num_experts);
  const int64_t e = p.num_experts;
  const int64_t per_group = e / p.num_groups;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
  std::vector<float> group_scores(static_cast<size_t>(p.num_groups));
  std::vector<int32_t> groups(static_cast<size_t>(p.topk_groups));

  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* logits = p.logits + t * e;
    std::copy(logits, logits + e, scores.begin());
    if (p.scoring == MoeScoring::kSoftmax) {
      SoftmaxInPlace(scores.data(), e);
    } else {
      for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
    }
    for (int64_t i = 0; i < e; ++i) {
      choice[i] = scores[i] + (p.correction_bias != nullptr ? p.correction_bias[i] : 0.0f);
    }

    if (p.method != MoeTopk::kGreedy) {
      for (int64_t g = 0; g < p.num_groups; ++g) {
        const float* c = &choice[g * per_group];
        if (p.method == MoeTopk::kNoauxTc) {
          float best = kNegInf, second = kNegInf;
          for (int64_t i = 0; i < per_group; ++i) {
            if (c[i] > best) {
              second = best;
              best = c[i];
            } else if (c[i] > second) {
              second = c[i];
            }
          }
          group_scores[g] = best + second;
        } else {
          group_scores[g] = *std::max_element(c, c + per_group);
        }
      }
      TopK(group_scores.data(), p.num_groups, p.topk_groups, groups.data());
      std::vector<bool> keep(static_cast<size_t>(p.num_groups), false);
      for (int32_t g : groups) keep[g] = true;
      for (int64_t i = 0; i < e; ++i) {
        if (!keep[i / per_group]) choice[i] = kNegInf;
      }
    }

    int32_t* ids = p.expert_ids + t * p.top_k;
    float* w = p.weights + t * p.top_k;
    TopK(choice.data(), e, p.top_k, ids);
    float sum = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      w[k] = scores[ids[k]];
      sum += w[k];
    }
    const bool normalize = p.normalize && p.top_k > 1;
    if (normalize) {
      const float denom = sum + 1e-20f;
      for (int64_t k = 0; k < p.top_k; ++k) w[k] /= denom;
    }
    if (!normalize || p.scale_normalized) {
      for (int64_t k = 0; k < p.top_k; ++k) w[k] *= p.routed_scaling_factor;
    }
  }
}

}  // namespace tandem::cpu
