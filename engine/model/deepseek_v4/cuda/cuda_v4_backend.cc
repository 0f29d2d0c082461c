#include "engine/model/deepseek_v4/cuda/cuda_v4_backend.h"

#include <algorithm>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/model/deepseek_v4/v4_model_info.h"
#include "engine/model/latent_kv_cache.h"

namespace tandem::v4 {
namespace {

class V4CudaBackend : public ModelBackend {
 public:
  V4CudaBackend(std::unique_ptr<cuda_v4::CudaV4Model> model, int device, int64_t kv_blocks)
      : model_(std::move(model)), info_(V4ModelInfo(model_->config())), device_(device), kv_blocks_(kv_blocks) {}
  const ModelInfo& config() const override { return info_; }
  std::string device_name() const override { return absl::StrCat("cuda:", device_); }
  bool kv_in_host_pool() const override { return false; }
  int64_t device_kv_blocks() const override { return kv_blocks_; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    if (absl::Status st = model_->EnsurePool(host.geometry()); !st.ok()) return st;
    return model_->Forward(batch, options);
  }
  absl::Status PoolRangesToHost(std::span<const KvExtent> ranges, KvPool& host) override {
    return model_->CopyRanges(ranges, host, /*to_host=*/true);
  }
  absl::Status PoolRangesFromHost(std::span<const KvExtent> ranges, KvPool& host) override {
    return model_->CopyRanges(ranges, host, /*to_host=*/false);
  }
  absl::Status CopyStateSlot(int64_t from, int64_t to) override { return model_->CopyStateSlot(from, to); }
  absl::Status KvToHost(int64_t, std::span<const int32_t>, int64_t, int64_t, KvPool&) override {
    return absl::UnimplementedError("DeepSeek-V4 on the GPU moves whole sequences (PoolRangesToHost)");
  }
  absl::Status KvFromHost(std::span<const int32_t>, int64_t, int64_t, KvPool&) override {
    return absl::UnimplementedError("DeepSeek-V4 on the GPU moves whole sequences (PoolRangesFromHost)");
  }

 private:
  std::unique_ptr<cuda_v4::CudaV4Model> model_;
  ModelInfo info_;
  int device_ = 0;
  int64_t kv_blocks_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadV4CudaBackend(const std::string& dir, const BackendOptions& options,
                                                                int device) {
  if (options.mtp) {
    return absl::FailedPreconditionError(
        "--speculative-tokens: DeepSeek-V4's MTP layer runs on the CPU only so far; use --device cpu or no drafts");
  }
  if (options.batch_invariant) {
    return absl::FailedPreconditionError("--batch-invariant: DeepSeek-V4 on the GPU is not batch-invariant yet");
  }
  absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> model = cuda_v4::CudaV4Model::Load(dir, {.device = device});
  if (!model.ok()) return model.status();
  int64_t blocks = options.kv_blocks;
  if (blocks <= 0) {
    // What gpu_memory_utilization leaves after the weights, less the activations of the
    // largest pass and the sequences' states, in blocks of every paged stream.
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InternalError("cannot read the GPU's free memory");
    }
    const std::vector<KvStream> streams = (*model)->kv_streams();
    const double budget = static_cast<double>(total) * options.gpu_memory_utilization -
                          static_cast<double>(total - free_bytes);
    const double states = static_cast<double>(SequenceStateBytes(streams)) * 3.0 * static_cast<double>(options.max_running);
    const double activations = 64.0 * 1024 * 1024 + static_cast<double>(options.max_batch_tokens) * 256 * 1024;
    const int64_t per_block = PagedBytesPerBlock(streams, static_cast<int32_t>(kKvBlockSize));
    blocks = per_block > 0 ? static_cast<int64_t>((budget - states - activations) / static_cast<double>(per_block)) : 0;
    if (blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the GPU has no room for a KV cache after DeepSeek-V4's weights (", (*model)->weight_bytes() >> 20,
          " MiB as float32): raise --gpu-memory-utilization or use a smaller model"));
    }
  }
  return std::unique_ptr<ModelBackend>(new V4CudaBackend(std::move(*model), device, blocks));
}

}  // namespace tandem::v4
