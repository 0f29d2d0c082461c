// The FP8 decode path of CudaDeepseekModel (LoadOptions::fp8_decode): the fused decode
// steps of an FP8 checkpoint multiply the linears' stored FP8 forms (cuda_weights.h) by
// float32 activations with cuda::QuantizedGemv, one byte a weight read instead of the
// bf16 copies' two. The attention's projections branch here from FusedAttention; the
// dense MLP and the MoE layer run whole here.
#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/quantized_gemv.h"
#include "kernels/cuda/weighted_row_sum.h"

namespace tandem {

using cuda_model::StepPlan;

bool CudaDeepseekModel::Impl::Fp8Decode(const StepPlan& plan) const {
  return options.fp8_decode && !options.batch_invariant && weights->fp8_linears > 0 && Fused(plan);
}

absl::Status CudaDeepseekModel::Impl::Fp8Product(const cuda_model::Fp8Linear& w, const float* x, int64_t ldx,
                                                 int64_t rows, float* y, int64_t ldy, bool accumulate,
                                                 const char* what, const float* norm_weight, float norm_eps) {
  int64_t at = 0;
  for (const cuda_model::Fp8Matrix& part : w.parts) {
    TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .w = part.codes,
                                            .scales = part.scales, .x = x, .ldx = ldx, .y = y + at, .ldy = ldy,
                                            .m = static_cast<int>(rows), .n = part.rows, .k = part.cols,
                                            .accumulate = accumulate, .norm_weight = norm_weight,
                                            .norm_eps = norm_eps},
                                           stream),
                       what);
    at += part.rows;
  }
  return Mark(what);
}

// The dense MLP of an Fp8Decode step: gate and up (FP8, the post-attention norm applied
// while the activations are staged), then down over their SwiGLU (likewise), added into
// the residual.
absl::Status CudaDeepseekModel::Impl::Fp8Mlp(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMlpWeights& w = *lw.mlp;
  const int64_t t = plan.rows, hidden = c.hidden_size, inter = w.down.cols;
  RETURN_IF_ERROR(Fp8Product(w.gate_up_fp8, act_.x, hidden, t, act_.gu, 2 * inter, false,
                             "MLP norm + gate_up (FP8)", lw.post_attention_norm, static_cast<float>(c.rms_norm_eps)));
  // DeepSeek's SwiGLU: silu(gate) * up, made from the gate/up products as they are staged.
  for (const cuda_model::Fp8Matrix& part : w.down_fp8.parts) {
    TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .w = part.codes,
                                            .scales = part.scales, .x = act_.gu, .ldx = 2 * inter, .y = act_.x,
                                            .ldy = hidden, .m = static_cast<int>(t), .n = part.rows, .k = part.cols,
                                            .accumulate = true, .swiglu = true},
                                           stream),
                       "MLP SiLU + down (FP8)");
  }
  return Mark("MLP SiLU + down (FP8)");
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
                                          .x_group = static_cast<int>(slots)},
                                         stream),
                     "experts gate_up (FP8)");
  RETURN_IF_ERROR(Mark("experts gate_up (FP8)"));
  TANDEM_CUDA_RETURN(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .x = act_.gu,
                                          .ldx = 2 * inter, .y = act_.y, .ldy = hidden, .m = 1, .n = hidden,
                                          .k = inter, .experts = w.fp8->down, .num_experts = w.groups,
                                          .ids = act_.fp8_ids, .problems = problems, .x_group = 1, .swiglu = true},
                                         stream),
                     "experts SiLU + down (FP8)");
  RETURN_IF_ERROR(Mark("experts SiLU + down (FP8)"));
  TANDEM_CUDA_RETURN(cuda::WeightedRowSum({.rows = act_.fp8_rows, .weights = act_.fp8_weights,
                                           .k = static_cast<int>(slots), .tokens = t, .width = hidden,
                                           .add = act_.x, .add_stride = hidden, .out = act_.x,
                                           .out_stride = hidden},
                                          stream),
                     "MoE combine");
  return Mark("MoE combine");
}

}  // namespace tandem
