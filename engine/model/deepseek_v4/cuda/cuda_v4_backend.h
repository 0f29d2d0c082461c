// DeepSeek-V4 on the GPU as a model backend (engine/model/model_backend.h): CudaV4Model
// over a GPU pool that mirrors the engine's host pool's geometry. Built with CUDA only;
// v4_backend.cc picks it for --device cuda.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_backend.h"

namespace tandem::v4 {

// Errors: FAILED_PRECONDITION for options the GPU form cannot serve yet (speculative
// decoding, --batch-invariant) or a device that does not exist; the loaders' otherwise.
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadV4CudaBackend(const std::string& dir, const BackendOptions& options,
                                                                int device);

}  // namespace tandem::v4
