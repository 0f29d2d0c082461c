// CHECK_CUDA / CHECK_CUBLAS for the CUDA benchmarks: a failed call ends the run, naming the
// call and the error (a benchmark has nothing to recover).
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cublas_api.h>
#include <cuda_runtime.h>

#define CHECK_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

#define CHECK_CUBLAS(expr)                                                                        \
  do {                                                                                             \
    const cublasStatus_t st_ = (expr);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, int(st_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)
