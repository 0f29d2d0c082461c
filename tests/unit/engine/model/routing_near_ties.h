// Telling a routing near-tie from an error when a GPU result is compared with the CPU
// reference. On random-weight models a token's k-th and (k+1)-th experts can score within
// the effect of the GPU's bf16 roundings (its expanded prefill attention takes bf16
// queries, keys, values and probabilities), and the GPU may then choose the other expert:
// that token's hidden state, and everything computed from it, moves by far more than a
// rounding. These helpers record the CPU's routing of every MoE layer
// (DeepseekForwardOptions::after_routing), list the routings a token would get were its
// logits moved by one bf16 step, and run the CPU again with chosen rows' routing replaced,
// so that a test can require the GPU to match the CPU exactly up to such resolved ties.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "kernels/cpu/moe_routing.h"

namespace tandem::testing {

// One token's routing at one layer: its experts and their weights (top_k each).
struct RoutingChoice {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Replacements, by (layer, batch row).
using RoutingOverrides = std::map<std::pair<int64_t, int64_t>, RoutingChoice>;

// A layer's routing as the CPU computed it: the parameters (pointers cleared), its logits
// [rows][experts], chosen experts and their weights [rows][top_k].
struct RecordedRouting {
  cpu::MoeRoutingParams params;
  std::vector<float> logits;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
using RecordedRoutings = std::map<int64_t, RecordedRouting>;  // by layer

// Forward options whose after_routing records every MoE layer into *record (may be null)
// and then applies *overrides (may be null). Both must outlive the Forward call.
DeepseekForwardOptions RoutingHooks(const RoutingOverrides* overrides, RecordedRoutings* record);

// The one bf16 step at a row's largest logit magnitude (bf16 keeps 8 significant bits).
float LogitStep(const float* logits, int64_t n);

// The routings of `row` other than the CPU's that appear when one chosen expert's logit
// moves down and one unchosen expert's up by LogitStep each (a perturbation within the
// GPU's roundings), each with its weights computed from the unperturbed logits as
// cpu::RouteMoe would for that choice. Empty when the row's routing is robust to that.
std::vector<RoutingChoice> NearTieAlternatives(const RecordedRouting& layer, int64_t row);

// The weights cpu::RouteMoe gives experts `ids` of a row with `logits` (scores without the
// correction bias, optionally normalized, scaled).
std::vector<float> RoutingWeights(const cpu::MoeRoutingParams& params, const float* logits,
                                  const std::vector<int32_t>& ids);

}  // namespace tandem::testing
