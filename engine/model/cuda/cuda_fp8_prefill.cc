// The FP8 prefill path of CudaDeepseekModel (LoadOptions::fp8_prefill): an FP8
// checkpoint's larger steps multiply the linears' stored FP8 forms on cuda::Fp8Gemm, each
// input quantized per token and 128 columns first (cuda::Fp8QuantizeRows): the attention
// projections and the dense MLP through Dense's `fp8` argument, the MoE layers' experts as
// two grouped launches over the permuted rows.
#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/fp8_gemm.h"

namespace tandem {

namespace {

// Fp8Gemm's tiles are 128 rows: fewer rows stay on the bf16 copies (cuBLAS or the grouped
// kernel), which waste no tile rows.
constexpr int64_t kFp8GemmMinRows = 128;

}  // namespace

bool CudaDeepseekModel::Impl::UseFp8Gemm(const cuda_model::Fp8Linear& w, int64_t rows) const {
  return options.fp8_prefill && !options.batch_invariant && act_.x_fp8 != nullptr && w.present() &&
         rows >= kFp8GemmMinRows && w.parts.front().cols % 16 == 0;
}

absl::StatusOr<cuda::Fp8GemmParams> CudaDeepseekModel::Impl::QuantizeFp8Input(const __nv_bfloat16* x, int64_t ldx,
                                                                              int64_t rows, int64_t k) {
  TANDEM_CUDA_RETURN(cuda::Fp8QuantizeRows({.x = x, .x_bf16 = true, .ldx = ldx, .q = act_.x_fp8, .ldq = k,
                                            .scales = act_.x_fp8_scales, .scales_stride = act_.x_fp8_rows,
                                            .m = static_cast<int>(rows), .k = static_cast<int>(k)},
                                           stream),
                     "quantizing a GEMM's input to FP8");
  ++fp8_gemms_;
  return cuda::Fp8GemmParams{.a = act_.x_fp8, .lda = k, .a_scales = act_.x_fp8_scales,
                             .a_scales_stride = act_.x_fp8_rows, .m = static_cast<int>(rows),
                             .k = static_cast<int>(k)};
}

absl::Status CudaDeepseekModel::Impl::DenseFp8(const cuda_model::Fp8Linear& w, const __nv_bfloat16* x, int64_t ldx,
                                               int64_t rows, void* y, int64_t ldy, Out out) {
  ASSIGN_OR_RETURN(cuda::Fp8GemmParams p, QuantizeFp8Input(x, ldx, rows, w.parts.front().cols));
  p.ldy = ldy;
  p.y_bf16 = out == Out::kBf16;
  p.accumulate = out == Out::kAccumulate;
  int64_t at = 0;  // the parts' outputs side by side along y's columns
  for (const cuda_model::Fp8Matrix& part : w.parts) {
    p.b = part.codes;
    p.ldb = part.cols;
    p.b_scales = part.scales;
    p.n = static_cast<int>(part.rows);
    p.y = out == Out::kBf16 ? static_cast<void*>(static_cast<__nv_bfloat16*>(y) + at)
                            : static_cast<void*>(static_cast<float*>(y) + at);
    TANDEM_CUDA_RETURN(cuda::Fp8Gemm(p, stream), "dense GEMM (FP8)");
    at += part.rows;
  }
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::MoeExpertsFp8(int64_t layer, int64_t rows) {
  const ModelConfig& c = config;
  const cuda_model::CudaMoeWeights& w = *weights->layers[layer].moe;
  const int64_t hidden = c.hidden_size, inter = w.inter;
  const int32_t* offsets = act_.group_offsets + layer * (groups_ + 1);
  RETURN_IF_ERROR(GatherExpertRows(rows));
  // One projection: the input quantized, then every expert's product in one launch.
  auto project = [&](const __nv_bfloat16* x, int64_t k, const uint8_t* b, const float* row_scales, int64_t n,
                     float* y, const char* what) -> absl::Status {
    ASSIGN_OR_RETURN(cuda::Fp8GemmParams p, QuantizeFp8Input(x, k, rows, k));
    p.b = b;
    p.ldb = k;
    p.b_scales = row_scales;
    p.b_row_scales = true;
    p.y = y;
    p.ldy = n;
    p.y_bf16 = false;
    p.n = static_cast<int>(n);
    p.groups = groups_;
    p.group_offsets = offsets;
    TANDEM_CUDA_RETURN(cuda::Fp8Gemm(p, stream), what);
    return Mark(what);
  };
  RETURN_IF_ERROR(project(act_.perm_bf16, hidden, w.fp8->gate_up_interleaved, w.fp8->gate_up_row_scales, 2 * inter,
                          act_.gu, "experts gate_up (FP8)"));
  RETURN_IF_ERROR(ExpertSiluMul(rows, inter));
  return project(act_.act_bf16, inter, w.fp8->down_codes, w.fp8->down_row_scales, hidden, act_.y,
                 "experts down (FP8)");
}

}  // namespace tandem
