// CudaV4Model's FP8 products on the FP8 tensor cores (Options::fp8_gemm): a pass's
// activations are float32; each product quantizes its input rows per 128 columns into the
// scratch (cuda::Fp8QuantizeRows) and multiplies them with the stored e4m3 weights and
// their 128 x 128 block scales (cuda::Fp8Gemm), float32 out.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/fp8_gemm.h"

namespace tandem::v4::cuda_v4 {
namespace {

constexpr int64_t kBlock = 128;

int64_t RoundUp16(int64_t v) { return (v + 15) / 16 * 16; }

bool Aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

absl::Status CudaV4Model::EnsureFp8Scratch(int64_t rows) {
  const int64_t cols = RoundUp16(weights_->max_fp8_cols);
  if (rows <= fp8_scratch_rows_ && cols <= fp8_scratch_cols_) return absl::OkStatus();
  // The work queued before may still read the old scratch.
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "finishing the work before the FP8 scratch grows");
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  const size_t codes = static_cast<size_t>(RoundUp16(rows * cols));
  RETURN_IF_ERROR(fp8_scratch_.Allocate(codes + static_cast<size_t>(rows * blocks) * sizeof(float),
                                        "the FP8 products' quantized activations"));
  fp8_scratch_rows_ = rows;
  fp8_scratch_cols_ = cols;
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaV4Model::Fp8GemmLinear(const float* x, int64_t ldx, const DeviceMatrix& w, float* y,
                                                int64_t ldy, int64_t m) {
  const int64_t k = w.cols;  // also the quantized rows' stride
  // Fp8QuantizeRows reads four floats at a time; Fp8Gemm's TMA needs 16-byte rows, and
  // its float32 stores pairs of columns.
  if (k % 16 != 0 || ldx % 4 != 0 || !Aligned(x, 16) || !Aligned(w.codes, 16) || ldy % 2 != 0 || !Aligned(y, 8) ||
      m > fp8_scratch_rows_ || k > fp8_scratch_cols_) {
    return false;
  }
  uint8_t* q = fp8_scratch_.get<uint8_t>();
  float* scales = reinterpret_cast<float*>(q + RoundUp16(fp8_scratch_rows_ * fp8_scratch_cols_));
  TANDEM_CUDA_RETURN(cuda::Fp8QuantizeRows({.x = x, .x_bf16 = false, .ldx = ldx, .q = q, .ldq = k,
                                            .scales = scales, .scales_stride = m, .m = static_cast<int>(m),
                                            .k = static_cast<int>(k)},
                                           stream_),
                     "quantizing an FP8 product's activations");
  TANDEM_CUDA_RETURN(cuda::Fp8Gemm({.a = q, .lda = k, .a_scales = scales, .a_scales_stride = m, .b = w.codes,
                                    .ldb = k, .b_scales = w.scales, .y = y, .ldy = ldy, .y_bf16 = false,
                                    .m = static_cast<int>(m), .n = static_cast<int>(w.rows), .k = static_cast<int>(k)},
                                   stream_),
                     "an FP8 product");
  ++fp8_gemms_;
  return true;
}

}  // namespace tandem::v4::cuda_v4
