// cuBLASLt's FP8 GEMM as the benchmarks' reference (fp8_gemm_bench, v4_cuda_decode_bench's
// prefill): block-scaled (DeepSeek's 128x128 weight and 1x128 activation scales) or one
// scale per tensor, bf16 out. Host code only.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "bench/cuda_check.h"

namespace tandem::bench {

// cuBLASLt FP8 GEMM of x[m][k] and w[n][k] (both K-major, "TN"), bf16 out. Weights as A:
// D[n][m] column-major = y[m][n] row-major; activations as A (transposed_output): D[m][n]
// column-major = y^T. cuBLASLt's block-scaled modes accept only some pairings of A and B
// scale modes; the benchmark takes the first form that runs.
class LtFp8 {
 public:
  enum class Scaling { kBlock, kTensor };
  LtFp8(cublasLtHandle_t lt, Scaling scaling, bool transposed_output, int m, int n, int k, const uint8_t* x,
        const float* x_scales, const uint8_t* w, const float* w_scales, __nv_bfloat16* y, void* workspace,
        size_t workspace_bytes)
      : lt_(lt), transposed_(transposed_output), x_(x), w_(w), y_(y), workspace_(workspace),
        workspace_bytes_(workspace_bytes) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    const float* a_scales = transposed_ ? x_scales : w_scales;
    const float* b_scales = transposed_ ? w_scales : x_scales;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof(a_scales)));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof(b_scales)));
    if (scaling == Scaling::kBlock) {
      const int32_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      const int32_t a_mode = transposed_ ? x_mode : w_mode, b_mode = transposed_ ? w_mode : x_mode;
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    }
    const int a_cols = transposed_ ? m : n, b_cols = transposed_ ? n : m;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, k, a_cols, k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, k, b_cols, k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, a_cols, b_cols, a_cols));
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                  sizeof(workspace_bytes_)));
    int found = 0;
    status_ = cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref, 1, &heuristic_, &found);
    if (status_ == CUBLAS_STATUS_SUCCESS && found == 0) status_ = CUBLAS_STATUS_NOT_SUPPORTED;
    cublasLtMatmulPreferenceDestroy(pref);
    if (status_ == CUBLAS_STATUS_SUCCESS) {  // a heuristic's algorithm may still refuse to run
      status_ = Matmul();
      CHECK_CUDA(cudaDeviceSynchronize());
    }
  }
  ~LtFp8() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
  }
  LtFp8(const LtFp8&) = delete;
  LtFp8& operator=(const LtFp8&) = delete;
  bool ok() const { return status_ == CUBLAS_STATUS_SUCCESS; }
  int status() const { return static_cast<int>(status_); }
  bool transposed() const { return transposed_; }
  void Run() { CHECK_CUBLAS(Matmul()); }

 private:
  cublasStatus_t Matmul() {
    const float alpha = 1.0f, beta = 0.0f;
    const void* a = transposed_ ? x_ : w_;
    const void* b = transposed_ ? w_ : x_;
    return cublasLtMatmul(lt_, desc_, &alpha, a, a_, b, b_, &beta, y_, d_, y_, d_, &heuristic_.algo, workspace_,
                          workspace_bytes_, nullptr);
  }

  cublasLtHandle_t lt_;
  bool transposed_;
  const uint8_t* x_;
  const uint8_t* w_;
  __nv_bfloat16* y_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
  cublasStatus_t status_ = CUBLAS_STATUS_NOT_INITIALIZED;
};

}  // namespace tandem::bench
