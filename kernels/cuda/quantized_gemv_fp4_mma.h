// The tensor-core form of QuantizedGemv for FP4 weights in the tiled layout (fp4_tiled.h),
// called by QuantizedGemv once it has checked the params.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/quantized_gemv.h"

namespace tandem::cuda::internal {

cudaError_t LaunchFp4TiledGemv(const QuantizedGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda::internal
