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

}  // namespace tandem
