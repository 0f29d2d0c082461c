// A batched matrix product whose every output is one fused multiply-add chain over k in
// order 0, 1, ..., k - 1, whatever m is (the batch-invariant mode's products that the
// default path hands to cuBLAS, whose algorithm changes with the shape):
//
//   C[b][i][j] (+)= sum_k A[b][i][k] * B[b][j][k]
//
// A and B float32 or bf16 with any strides (B's element (j, k) at b + j * ldb_n + k * ldb_k,
// so a [k][n] matrix is read in place); C float32 (optionally accumulated) or bf16. CUDA
// cores, 64x64 output tiles, k in steps of 16 through shared memory. No allocation inside.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct InvariantGemmParams {
  const void* a = nullptr;  // [batch][m][k]: element (i, kk) of batch b at b * a_batch + i * lda + kk
  bool a_bf16 = false;
  int64_t lda = 0;
  int64_t a_batch = 0;
  const void* b = nullptr;  // element (j, kk) of batch bb at bb * b_batch + j * ldb_n + kk * ldb_k
  bool b_bf16 = false;
  int64_t ldb_n = 0;
  int64_t ldb_k = 0;
  int64_t b_batch = 0;
  void* c = nullptr;  // element (i, j) of batch b at b * c_batch + i * ldc + j
  bool c_bf16 = false;
  bool accumulate = false;  // float32 C only: C += instead of C =
  int64_t ldc = 0;
  int64_t c_batch = 0;
  int m = 0;
  int n = 0;
  int k = 0;
  int batch = 1;
};

cudaError_t InvariantGemm(const InvariantGemmParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
