// Owned device and pinned host allocations for the CUDA model, and an error helper that
// turns CUDA/cuBLAS failures into absl::Status values naming the failed step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cuda_model {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

inline absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

#define TANDEM_CUDA_RETURN(expr, what)                                                  \
  do {                                                                                \
    const absl::Status tandem_cuda_status_ = ::tandem::cuda_model::CudaStatus((expr), what); \
    if (!tandem_cuda_status_.ok()) return tandem_cuda_status_;                        \
  } while (0)

#define TANDEM_CUBLAS_RETURN(expr, what)                                                  \
  do {                                                                                  \
    const absl::Status tandem_cublas_status_ = ::tandem::cuda_model::CublasStatus((expr), what); \
    if (!tandem_cublas_status_.ok()) return tandem_cublas_status_;                      \
  } while (0)

// Bytes from one CUDA allocator, freed on destruction; movable. `Allocator` gives
// Alloc(void**, size_t), Free(void*) and kMemory (what the error message calls it).
template <typename Allocator>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  ~CudaBuffer() { Reset(); }
  CudaBuffer(CudaBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  absl::Status Allocate(size_t bytes, const char* what) {
    Reset();
    if (bytes == 0) return absl::OkStatus();
    const cudaError_t err = Allocator::Alloc(&ptr_, bytes);
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of ", Allocator::kMemory,
                                                       " for ", what, ": ", cudaGetErrorString(err)));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void Reset() {
    if (ptr_ != nullptr) Allocator::Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct DeviceAllocator {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void Free(void* p) { cudaFree(p); }
  static constexpr const char* kMemory = "GPU memory";
};
struct PinnedAllocator {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void Free(void* p) { cudaFreeHost(p); }
  static constexpr const char* kMemory = "pinned host memory";
};
using DeviceBuffer = CudaBuffer<DeviceAllocator>;  // cudaMalloc
using PinnedBuffer = CudaBuffer<PinnedAllocator>;  // cudaMallocHost

// Carves aligned sub-ranges out of one allocation: sizes are computed with a null base
// first (Plan), then the same calls run over the real buffer.
class Arena {
 public:
  explicit Arena(char* base = nullptr) : base_(base) {}
  template <typename T>
  T* Take(size_t count) {
    offset_ = (offset_ + 255) & ~size_t{255};
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace tandem::cuda_model
