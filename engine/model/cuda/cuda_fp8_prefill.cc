// The FP8 prefill path of CudaDeepseekModel (LoadOptions::fp8_prefill): an FP8
// checkpoint's larger steps multiply the linears' stored FP8 forms on cuda::Fp8Gemm, each
// input quantized per token and 128 columns first (cuda::Fp8QuantizeRows): the attention
// projections and the dense MLP through Dense's `fp8` argument, the MoE layers' experts as
// two grouped launches over the permuted rows.
#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/silu_mul.h"

namespace tandem {

namespace {

// Fp8Gemm's tiles are 128 rows: fewer rows stay on the bf16 copies (cuBLAS or the grouped
// kernel), which waste no tile rows.
constexpr int64_t kFp8GemmMinRows = 128;

}  // namespace

bool CudaDeepseekModel::Impl::UseFp8Gemm(const cuda_model::Fp8Linear& w, int64_t rows) const {
  return options.fp8_prefill && !options.batch_invariant && act_.x_fp8 != nullptr && w.present() &&
         rows >= kFp8GemmMinRows && rows <= options.max_batch_tokens && w.parts.front().cols % 16 == 0;
}

absl::Status CudaDeepseekModel::Impl::DenseFp8(const cuda_model::Fp8Linear& w, const __nv_bfloat16* x, int64_t ldx,
                                               int64_t rows, void* y, int64_t ldy, Out out) {
  const int64_t k = w.parts.front().cols, t = act_.x_fp8_rows;
  TANDEM_CUDA_RETURN(cuda::Fp8QuantizeRows({.x = x, .x_bf16 = true, .ldx = ldx, .q = act_.x_fp8, .ldq = k,
                                            .scales = act_.x_fp8_scales, .scales_stride = t,
                                            .m = static_cast<int>(rows), .k = static_cast<int>(k)},
                                           stream),
                     "quantizing a GEMM's input to FP8");
  ++fp8_gemms_;
  int64_t at = 0;  // the parts' outputs side by side along y's columns
  for (const cuda_model::Fp8Matrix& part : w.parts) {
    void* yp = out == Out::kBf16 ? static_cast<void*>(static_cast<__nv_bfloat16*>(y) + at)
                                 : static_cast<void*>(static_cast<float*>(y) + at);
    TANDEM_CUDA_RETURN(cuda::Fp8Gemm({.a = act_.x_fp8, .lda = k, .a_scales = act_.x_fp8_scales, .a_scales_stride = t,
                                      .b = part.codes, .ldb = part.cols, .b_scales = part.scales, .y = yp,
                                      .ldy = ldy, .y_bf16 = out == Out::kBf16,
                                      .accumulate = out == Out::kAccumulate, .m = static_cast<int>(rows),
                                      .n = static_cast<int>(part.rows), .k = static_cast<int>(part.cols)},
                                     stream),
                       "dense GEMM (FP8)");
    at += part.rows;
  }
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::MoeExpertsFp8(int64_t layer, int64_t rows) {
  const ModelConfig& c = config;
  const cuda_model::CudaMoeWeights& w = *weights->layers[layer].moe;
  const int64_t hidden = c.hidden_size, inter = w.inter, stride = act_.x_fp8_rows;
  const int32_t* offsets = act_.group_offsets + layer * (groups_ + 1);
  TANDEM_CUDA_RETURN(cuda::GatherRows({.src = act_.h_bf16, .src_stride = hidden, .rows = act_.sorted_token,
                                       .num_rows = rows, .cols = hidden, .dst = act_.perm_bf16, .dst_stride = hidden},
                                      stream),
                     "permuting tokens");
  RETURN_IF_ERROR(Mark("MoE gather rows"));
  // One projection: the input quantized, then every expert's product in one launch.
  auto project = [&](const __nv_bfloat16* x, int64_t k, const uint8_t* b, const float* row_scales, int64_t n,
                     float* y, const char* what) -> absl::Status {
    TANDEM_CUDA_RETURN(cuda::Fp8QuantizeRows({.x = x, .x_bf16 = true, .ldx = k, .q = act_.x_fp8, .ldq = k,
                                              .scales = act_.x_fp8_scales, .scales_stride = stride,
                                              .m = static_cast<int>(rows), .k = static_cast<int>(k)},
                                             stream),
                       "quantizing the experts' input to FP8");
    ++fp8_gemms_;
    TANDEM_CUDA_RETURN(cuda::Fp8Gemm({.a = act_.x_fp8, .lda = k, .a_scales = act_.x_fp8_scales,
                                      .a_scales_stride = stride, .b = b, .ldb = k, .b_scales = row_scales, .y = y,
                                      .ldy = n, .y_bf16 = false, .m = static_cast<int>(rows),
                                      .n = static_cast<int>(n), .k = static_cast<int>(k), .groups = groups_,
                                      .group_offsets = offsets, .b_row_scales = true},
                                     stream),
                       what);
    return Mark(what);
  };
  RETURN_IF_ERROR(project(act_.perm_bf16, hidden, w.fp8->gate_up_interleaved, w.fp8->gate_up_row_scales, 2 * inter,
                          act_.gu, "experts gate_up (FP8)"));
  TANDEM_CUDA_RETURN(cuda::SiluMul({.x = act_.gu, .x_stride = 2 * inter, .rows = rows, .cols = inter,
                                    .interleave = cuda_model::kGateUpInterleave, .out_bf16 = act_.act_bf16,
                                    .out_stride = inter},
                                   stream),
                     "SiLU");
  RETURN_IF_ERROR(Mark("SiLU"));
  return project(act_.act_bf16, inter, w.fp8->down_codes, w.fp8->down_row_scales, hidden, act_.y,
                 "experts down (FP8)");
}

}  // namespace tandem
