// The tensor-core forms of QuantizedGemv: FP4 weights in the tiled layout (fp4_tiled.h) and
// FP8 weights (128 x 128 block scales) whose 128-row blocks are whole; called by
// QuantizedGemv once it has checked the params.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/quantized_gemv.h"

namespace tandem::cuda::internal {

cudaError_t LaunchFp4TiledGemv(const QuantizedGemvParams& p, cudaStream_t stream);
// FP8 with k a multiple of 64 (n need not be a multiple of 128).
cudaError_t LaunchFp8MmaGemv(const QuantizedGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda::internal
