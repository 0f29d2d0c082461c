// A cuBLAS handle with a preallocated workspace (so that calls can be captured in CUDA
// graphs) and the GEMMs the model needs, in row-major terms:
//   Linear:    y[m][n] (+)= x[m][k] . w[n][k]^T   bf16 in, fp32 accumulate, fp32 or bf16 out
//   LinearF32: the same in plain fp32 (no TF32): the MoE router
//   Batched:   c_i[m][n] = a_i[m][k] . b_i for i < batch, b_i [n][k] (transposed) or
//              [k][n], strided (the per-head products of MLA's absorbed form); bf16 in,
//              or float32 throughout (BatchedF32, no TF32)
// Errors are cuBLAS statuses. Not thread-safe: one per stream-owning thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

class CublasGemm {
 public:
  CublasGemm() = default;
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // Creates the handle and the workspace on the current device.
  cublasStatus_t Init(size_t workspace_bytes = size_t{64} << 20);
  bool initialized() const { return handle_ != nullptr; }

  struct LinearParams {
    const __nv_bfloat16* x = nullptr;  // [m][ldx]
    int64_t ldx = 0;
    const __nv_bfloat16* w = nullptr;  // [n][ldw]
    int64_t ldw = 0;
    void* y = nullptr;  // float or bf16 [m][ldy]
    int64_t ldy = 0;
    bool y_bf16 = false;
    bool accumulate = false;  // y += (float y only)
    int64_t m = 0, n = 0, k = 0;
  };
  cublasStatus_t Linear(const LinearParams& p, cudaStream_t stream);

  struct LinearF32Params {
    const float* x = nullptr;  // [m][ldx]
    int64_t ldx = 0;
    const float* w = nullptr;  // [n][ldw]
    int64_t ldw = 0;
    float* y = nullptr;  // [m][ldy]
    int64_t ldy = 0;
    int64_t m = 0, n = 0, k = 0;
  };
  cublasStatus_t LinearF32(const LinearF32Params& p, cudaStream_t stream);

  struct BatchedParams {
    const __nv_bfloat16* a = nullptr;  // a_i = a + i * stride_a, [m][lda]
    int64_t lda = 0, stride_a = 0;
    const __nv_bfloat16* b = nullptr;  // b_i = b + i * stride_b: [n][ldb] if b_transposed else [k][ldb]
    int64_t ldb = 0, stride_b = 0;
    bool b_transposed = true;
    void* c = nullptr;  // c_i = c + i * stride_c, float or bf16 [m][ldc]
    int64_t ldc = 0, stride_c = 0;
    bool c_bf16 = false;
    int64_t m = 0, n = 0, k = 0, batch = 1;
  };
  cublasStatus_t Batched(const BatchedParams& p, cudaStream_t stream);

  struct BatchedF32Params {
    const float* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const float* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    bool b_transposed = true;
    float* c = nullptr;
    int64_t ldc = 0, stride_c = 0;
    int64_t m = 0, n = 0, k = 0, batch = 1;
  };
  cublasStatus_t BatchedF32(const BatchedF32Params& p, cudaStream_t stream);

 private:
  cublasStatus_t Bind(cudaStream_t stream);

  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  bool stream_bound_ = false;
};

}  // namespace tandem::cuda
