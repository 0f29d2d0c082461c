// The FP8 decode path of CudaDeepseekModel (LoadOptions::fp8_decode): the fused decode
// steps of an FP8 checkpoint multiply the linears' stored FP8 forms (cuda_weights.h) by
// float32 activations with cuda::QuantizedGemv, one byte a weight read instead of the
// bf16 copies' two. The attention's projections branch here from FusedAttention; the
// dense MLP and the MoE layer run whole here.
#include <cmath>

#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/clamped_swiglu.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/quantized_gemv.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/weighted_row_sum.h"

namespace tandem {

using cuda_model::StepPlan;

bool CudaDeepseekModel::Impl::Fp8Decode(const StepPlan& plan) const {
  return options.fp8_decode && !options.batch_invariant && weights->fp8_linears > 0 && Fused(plan);
}

absl::StatusOr<CudaDeepseekModel::Impl::Fp8Input> CudaDeepseekModel::Impl::Fp8Activations(const Fp8Input& in,
                                                                                           int64_t rows, int64_t k) {
  if (in.norm_weight != nullptr) {
    TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = in.x, .weight = in.norm_weight, .out = act_.h_f32, .rows = rows, .dim = k,
                                      .x_stride = in.ldx, .out_stride = k, .eps = in.norm_eps},
                                     stream),
                       "norm");
    RETURN_IF_ERROR(Mark("norm (FP8 path)"));
    return Fp8Input{.x = act_.h_f32, .ldx = k};
  }
  if (!in.swiglu) return in;
  // DeepSeek's SwiGLU, silu(gate) * up: V4's kernel without a clamp.
  TANDEM_CUDA_RETURN(cuda::ClampedSwiGlu({.x = in.x, .x_stride = in.ldx, .rows = rows, .cols = k, .limit = INFINITY,
                                          .out = act_.act_f32, .out_stride = k},
                                         stream),
                     "SiLU");
  RETURN_IF_ERROR(Mark("SiLU (FP8 path)"));
  return Fp8Input{.x = act_.act_f32, .ldx = k};
}

absl::Status CudaDeepseekModel::Impl::Fp8Product(const cuda_model::Fp8Linear& w, const Fp8Input& input, int64_t rows,
                                                 float* y, int64_t ldy, bool accumulate, const char* what) {
  ASSIGN_OR_RETURN(const Fp8Input in, Fp8Activations(input, rows, w.parts.front().cols));
  int64_t at = 0;
  for (const cuda_model::Fp8Matrix& part : w.parts) {
    TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .w = part.codes,
                                            .scales = part.scales, .x = in.x, .ldx = in.ldx, .y = y + at, .ldy = ldy,
                                            .m = static_cast<int>(rows), .n = part.rows, .k = part.cols,
                                            .accumulate = accumulate, .scalar = !options.fp8_tensor_cores},
                                           stream),
                       what);
    at += part.rows;
  }
  return Mark(what);
}

// The dense MLP of an Fp8Decode step: the post-attention norm, gate and up (FP8), their
// SwiGLU, down (FP8) added into the residual.
absl::Status CudaDeepseekModel::Impl::Fp8Mlp(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMlpWeights& w = *lw.mlp;
  const int64_t t = plan.rows, hidden = c.hidden_size, inter = w.down.cols;
  RETURN_IF_ERROR(Fp8Product(w.gate_up_fp8,
                             {.x = act_.x, .ldx = hidden, .norm_weight = lw.post_attention_norm,
                              .norm_eps = static_cast<float>(c.rms_norm_eps)},
                             t, act_.gu, 2 * inter, false, "MLP gate_up (FP8)"));
  return Fp8Product(w.down_fp8, {.x = act_.gu, .ldx = 2 * inter, .swiglu = true}, t, act_.x, hidden, true,
                    "MLP down (FP8)");
}

// The MoE layer of an Fp8Decode step: MoeFusedRoute (norm, router, routing, into rows of
// top_k + n_shared slots whose last n_shared name the shared experts, act_.fp8_ids), then
// every (token, slot) a problem of the routed FP8 GEMV (gate_up; down over the SwiGLU of
// its products), then the weighted sum into the residual.
absl::Status CudaDeepseekModel::Impl::Fp8Moe(int64_t layer, const StepPlan& plan, cuda::MoeRoutingParams routing,
                                             cuda::MoePermuteParams permute) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMoeWeights& w = *lw.moe;
  const int64_t t = plan.rows, hidden = c.hidden_size, inter = w.inter;
  const int64_t slots = c.num_experts_per_tok + c.n_shared_experts;
  const int problems = static_cast<int>(t * slots);
  routing.expert_ids = act_.fp8_ids;
  permute.expert_ids = act_.fp8_ids;
  routing.weights = act_.fp8_weights;
  permute.weights = act_.fp8_weights;
  routing.out_stride = static_cast<int>(slots);
  TANDEM_CUDA_RETURN(cuda::MoeFusedRoute({.x = act_.x, .x_stride = hidden, .norm_weight = lw.post_attention_norm,
                                          .norm_eps = static_cast<float>(c.rms_norm_eps),
                                          .hidden = static_cast<int>(hidden), .router = w.router,
                                          .h_bf16 = act_.h_bf16, .h_f32 = act_.h_f32, .h_stride = hidden,
                                          .router_logits = act_.router_logits, .counter = act_.route_counter,
                                          .routing = routing, .permute = permute},
                                         stream),
                     "MoE routing");
  RETURN_IF_ERROR(Mark("MoE norm + router + routing"));
  TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .x = act_.h_f32,
                                          .ldx = hidden, .y = act_.gu, .ldy = 2 * inter, .m = 1, .n = 2 * inter,
                                          .k = hidden, .experts = w.fp8->gate_up, .num_experts = w.groups,
                                          .ids = act_.fp8_ids, .problems = problems,
                                          .x_group = static_cast<int>(slots), .scalar = !options.fp8_tensor_cores},
                                         stream),
                     "experts gate_up (FP8)");
  RETURN_IF_ERROR(Mark("experts gate_up (FP8)"));
  ASSIGN_OR_RETURN(const Fp8Input act, Fp8Activations({.x = act_.gu, .ldx = 2 * inter, .swiglu = true}, problems, inter));
  TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .x = act.x, .ldx = act.ldx,
                                          .y = act_.y, .ldy = hidden, .m = 1, .n = hidden, .k = inter,
                                          .experts = w.fp8->down, .num_experts = w.groups, .ids = act_.fp8_ids,
                                          .problems = problems, .x_group = 1, .scalar = !options.fp8_tensor_cores},
                                         stream),
                     "experts down (FP8)");
  RETURN_IF_ERROR(Mark("experts down (FP8)"));
  TANDEM_CUDA_RETURN(cuda::WeightedRowSum({.rows = act_.fp8_rows, .weights = act_.fp8_weights,
                                           .k = static_cast<int>(slots), .tokens = t, .width = hidden,
                                           .add = act_.x, .add_stride = hidden, .out = act_.x,
                                           .out_stride = hidden},
                                          stream),
                     "MoE combine");
  return Mark("MoE combine");
}

}  // namespace tandem
