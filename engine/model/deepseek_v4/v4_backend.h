// DeepSeek-V4 as a model backend (engine/model/model_backend.h): PagedV4Model on the
// CPU over the engine's KV pool. The engine's KV export and import, prefix cache and
// transfers do not move V4's streams yet, so the engine runs it with none of them
// (docs/model-neutral-engine.md); the GPU kernels are issue 22's.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_v4/v4_model_info.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "engine/model/model_backend.h"

namespace tandem::v4 {

// Loads a deepseek_v4 checkpoint for options.device: the CPU engine, or on a GPU
// (cuda/cuda_v4_backend.h; FAILED_PRECONDITION in a build without CUDA). Errors: the
// loaders' (config, weights).
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadV4Backend(const std::string& dir, const BackendOptions& options);

}  // namespace tandem::v4
