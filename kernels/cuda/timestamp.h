// A GPU timestamp between two kernels of a stream, for measuring where a step's time goes
// as it runs (graphs and programmatic launch included): the timestamp kernel lets the next
// kernel start early exactly as the previous one did, then waits for the previous kernel
// to complete and writes %globaltimer (ns) to *slot. The difference between two
// consecutive stamps is the time the kernels between them added to the chain.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

cudaError_t RecordTimestamp(uint64_t* slot, cudaStream_t stream);

}  // namespace tandem::cuda
