#include "kernels/cuda/cublas_gemm.h"

namespace tandem::cuda {

CublasGemm::~CublasGemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

cublasStatus_t CublasGemm::Init(size_t workspace_bytes) {
  if (handle_ != nullptr) return CUBLAS_STATUS_SUCCESS;
  if (cudaMalloc(&workspace_, workspace_bytes) != cudaSuccess) {
    workspace_ = nullptr;
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  workspace_bytes_ = workspace_bytes;
  const cublasStatus_t s = cublasCreate(&handle_);
  if (s != CUBLAS_STATUS_SUCCESS) {
    handle_ = nullptr;
    return s;
  }
  return cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH);  // no TF32 for the fp32 GEMMs
}

// cublasSetStream resets the workspace to cuBLAS's own pool: set both on every change.
cublasStatus_t CublasGemm::Bind(cudaStream_t stream) {
  if (handle_ == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream_bound_ && stream == stream_) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = cublasSetStream(handle_, stream);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(handle_, workspace_, workspace_bytes_);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  stream_ = stream;
  stream_bound_ = true;
  return CUBLAS_STATUS_SUCCESS;
}

// Row-major C[m][n] = A[m][k] . B is column-major C^T[n][m] = B^T . A^T: cuBLAS sees the
// operands swapped, B first. B stored [n][k] (a Linear weight) is transposed for cuBLAS.
cublasStatus_t CublasGemm::Linear(const LinearParams& p, cudaStream_t stream) {
  if (p.m == 0) return CUBLAS_STATUS_SUCCESS;
  if (p.accumulate && p.y_bf16) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t s = Bind(stream);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  return cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
                      static_cast<int>(p.k), &alpha, p.w, CUDA_R_16BF, static_cast<int>(p.ldw), p.x, CUDA_R_16BF,
                      static_cast<int>(p.ldx), &beta, p.y, p.y_bf16 ? CUDA_R_16BF : CUDA_R_32F,
                      static_cast<int>(p.ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t CublasGemm::LinearF32(const LinearF32Params& p, cudaStream_t stream) {
  if (p.m == 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = Bind(stream);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
                     static_cast<int>(p.k), &alpha, p.w, static_cast<int>(p.ldw), p.x, static_cast<int>(p.ldx), &beta,
                     p.y, static_cast<int>(p.ldy));
}

cublasStatus_t CublasGemm::Batched(const BatchedParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.batch == 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = Bind(stream);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasGemmStridedBatchedEx(
      handle_, p.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
      static_cast<int>(p.k), &alpha, p.b, CUDA_R_16BF, static_cast<int>(p.ldb), p.stride_b, p.a, CUDA_R_16BF,
      static_cast<int>(p.lda), p.stride_a, &beta, p.c, p.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<int>(p.ldc),
      p.stride_c, static_cast<int>(p.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t CublasGemm::BatchedF32(const BatchedF32Params& p, cudaStream_t stream) {
  if (p.m == 0 || p.batch == 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = Bind(stream);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const float alpha = 1.0f, beta = 0.0f;
  return cublasSgemmStridedBatched(handle_, p.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                                   static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &alpha, p.b,
                                   static_cast<int>(p.ldb), p.stride_b, p.a, static_cast<int>(p.lda), p.stride_a, &beta,
                                   p.c, static_cast<int>(p.ldc), p.stride_c, static_cast<int>(p.batch));
}

}  // namespace tandem::cuda
