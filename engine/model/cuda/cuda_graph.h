// CUDA graph capture shared by the GPU models' decode paths (cuda_deepseek_model.cc,
// deepseek_v4/cuda/cuda_v4_model.cc): what `enqueue` puts on `stream`, captured and
// instantiated. The capture is ended (and nothing kept) when `enqueue` fails.
#pragma once

#include <cuda_runtime.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/util/status_macros.h"

namespace tandem::cuda_model {

inline absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream, absl::FunctionRef<absl::Status()> enqueue,
                                                     const char* what) {
  TANDEM_CUDA_RETURN(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), what);
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  TANDEM_CUDA_RETURN(end, what);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TANDEM_CUDA_RETURN(made, what);
  return exec;
}

}  // namespace tandem::cuda_model
