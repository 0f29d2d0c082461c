// The routed FP4 form of QuantizedGemv (DeepSeek-V4's routed experts at decode: a problem
// per token and slot, one row each) as tiles of weight rows shared by a persistent grid,
// instead of a grid column per problem. Called by QuantizedGemv once it has checked the
// params, where Fp4ExpertGemvApplies.
//
// A block's 256 threads work as row pairs of 16, 8 or 4 lanes (the narrowest whose pass of 4
// 16-byte loads a lane, 32 codes each, still fills a row: 2048, 1024 or 512 columns), and a
// lane keeps two passes in flight: the next one's loads go out before this one's products.
// Tiles are (problem, 32 / 64 / 128 rows), spread over the blocks so that a batch's problems
// share every multiprocessor; every block stages the x rows of all problems once (float32,
// conflict-free planes), after the expert ids' writer has finished (programmatic dependent
// launch). An id outside the experts gives zeros (with accumulate: nothing added). The
// widening is the scalar kernel's (WidenFp4), the sums the same real sums in another order.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/quantized_gemv.h"

namespace tandem::cuda::internal {

// Routed FP4 (experts set, kFp4Group32, expert_tiles) whose rows split into whole tiles and
// whose x rows fit the shared memory; x and y aligned for float4 / float2 access.
bool Fp4ExpertGemvApplies(const QuantizedGemvParams& p);

cudaError_t LaunchFp4ExpertGemv(const QuantizedGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda::internal
