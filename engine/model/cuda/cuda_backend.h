// The engine's CUDA backend (model_backend.h) over CudaDeepseekModel: Forward runs on the
// GPU's own bf16 KV pool; KvToHost / KvFromHost move a sequence's entries between that
// pool and the engine's float32 host pool (the one the transfer layer registers), block
// run by block run, for KV export after each layer and for imported KV.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_backend.h"

namespace tandem {

// cudaGetDeviceCount, 0 when it fails (no driver, no GPU).
int CudaDevicesVisible();

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadCudaBackend(const std::string& dir, const BackendOptions& options,
                                                              int device_index);

}  // namespace tandem
