// What the engine runs the model on (DESIGN.md §7): the CPU reference (DeepseekModel) or
// a device backend (engine/model/cuda). The engine always owns a host KV pool
// (LatentKvCache, float32): the memory the transfer layer registers and that KV export
// and import read and write. The CPU backend computes in that pool directly. A device
// backend keeps its own pool with the same block ids and moves entries between the two
// only where the engine asks: KvToHost after a layer of a prefill whose KV is exported,
// KvFromHost before the first step of a request whose KV was imported.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_config.h"

namespace tandem {

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu", "cuda:0", ...
  virtual std::string device_name() const = 0;
  // True when Forward computes in the host pool itself (no KvToHost/KvFromHost needed).
  virtual bool kv_in_host_pool() const = 0;
  // Blocks the backend's own pool holds (device backends); 0: no limit of its own.
  virtual int64_t device_kv_blocks() const { return 0; }

  // DeepseekModel::Forward's contract; `host` is the engine's pool.
  virtual absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, LatentKvCache& host,
                                                     const ForwardOptions& options) = 0;

  // Device backends: copy positions [begin, end) of a sequence (its block table) between
  // the device pool and the host pool: one layer to the host, every layer from it.
  virtual absl::Status KvToHost(int64_t /*layer*/, std::span<const int32_t> /*block_table*/, int64_t /*begin*/,
                                int64_t /*end*/, LatentKvCache& /*host*/) {
    return absl::OkStatus();
  }
  virtual absl::Status KvFromHost(std::span<const int32_t> /*block_table*/, int64_t /*begin*/, int64_t /*end*/,
                                  LatentKvCache& /*host*/) {
    return absl::OkStatus();
  }
};

// The CPU reference backend.
class CpuBackend : public ModelBackend {
 public:
  explicit CpuBackend(std::unique_ptr<DeepseekModel> model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return "cpu"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, LatentKvCache& host,
                                             const ForwardOptions& options) override {
    return model_->Forward(batch, host, options);
  }
  DeepseekModel& model() { return *model_; }

 private:
  std::unique_ptr<DeepseekModel> model_;
};

// Where the engine runs: "cpu", "cuda" or "cuda:N". Errors name the flag value.
struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;
};
absl::StatusOr<DeviceSpec> ParseDevice(const std::string& device);

struct BackendOptions {
  std::string device = "cpu";
  int num_threads = 0;                    // cpu
  double gpu_memory_utilization = 0.9;    // cuda: fraction of the GPU's memory for weights + KV
  int64_t max_batch_tokens = 2048;        // cuda: sizes the preallocated activations
  int64_t max_running = 64;
  int64_t kv_blocks = 0;                  // cuda: the device pool's blocks (0: from gpu_memory_utilization)
};

// Loads the checkpoint in `dir` onto the device of `options`. A CUDA device in a build
// without CUDA, or on a machine without a usable GPU, is FAILED_PRECONDITION saying why.
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadBackend(const std::string& dir, const BackendOptions& options);

}  // namespace tandem
