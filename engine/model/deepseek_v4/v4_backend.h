// DeepSeek-V4 as a model backend (engine/model/model_backend.h): PagedV4Model on the
// CPU over the engine's KV pool. The engine's KV export and import, prefix cache and
// transfers do not move V4's streams yet, so the engine runs it with none of them
// (docs/model-neutral-engine.md); the GPU kernels are issue 22's.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "engine/model/model_backend.h"

namespace tandem::v4 {

// Loads a deepseek_v4 checkpoint for options.device. Errors: FAILED_PRECONDITION for a
// CUDA device (no V4 kernels yet); the loader's (config, weights) otherwise.
// What the engine and the router need of a V4 checkpoint (model_info.h).
ModelInfo V4ModelInfo(const DeepseekV4Config& c);

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadV4Backend(const std::string& dir, const BackendOptions& options);

}  // namespace tandem::v4
