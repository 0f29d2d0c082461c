#include "engine/model/cuda/cuda_backend.h"

#include <algorithm>

#include "engine/model/cuda/cuda_deepseek_model.h"
#include "engine/util/status_macros.h"

namespace tandem {
namespace {

class CudaBackend : public ModelBackend {
 public:
  explicit CudaBackend(std::unique_ptr<CudaDeepseekModel> model) : model_(std::move(model)) {}

  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return model_->device_name(); }
  bool kv_in_host_pool() const override { return false; }
  int64_t device_kv_blocks() const override { return model_->num_blocks(); }

  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, LatentKvCache& /*host*/,
                                             const ForwardOptions& options) override {
    return model_->Forward(batch, options);
  }

  absl::Status KvToHost(int64_t layer, std::span<const int32_t> table, int64_t begin, int64_t end,
                        LatentKvCache& host) override {
    return ForEachBlockRun(table, begin, end, host, [&](int64_t p, int64_t n) {
      return model_->ReadKvEntries(layer, table, p, n, host.Entry(layer, table, p));
    });
  }

  absl::Status KvFromHost(std::span<const int32_t> table, int64_t begin, int64_t end, LatentKvCache& host) override {
    for (int64_t layer = 0; layer < host.num_layers(); ++layer) {
      RETURN_IF_ERROR(ForEachBlockRun(table, begin, end, host, [&](int64_t p, int64_t n) {
        return model_->WriteKvEntries(layer, table, p, host.Entry(layer, table, p), n);
      }));
    }
    return absl::OkStatus();
  }

 private:
  // Positions [begin, end) in runs that stay inside one block: contiguous in both pools.
  template <typename F>
  static absl::Status ForEachBlockRun(std::span<const int32_t> table, int64_t begin, int64_t end,
                                      const LatentKvCache& host, F&& f) {
    const int64_t bs = host.block_size();
    if (begin < 0 || end > static_cast<int64_t>(table.size()) * bs) {
      return absl::InvalidArgumentError("KV copy beyond the sequence's blocks");
    }
    for (int64_t p = begin; p < end;) {
      const int64_t n = std::min(end, (p / bs + 1) * bs) - p;
      RETURN_IF_ERROR(f(p, n));
      p += n;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<CudaDeepseekModel> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadCudaBackend(const std::string& dir, const BackendOptions& options,
                                                              int device_index) {
  CudaDeepseekModel::LoadOptions lo;
  lo.device = device_index;
  lo.max_batch_tokens = options.max_batch_tokens;
  lo.max_seqs = options.max_running;
  lo.gpu_memory_utilization = options.gpu_memory_utilization;
  lo.kv_blocks = options.kv_blocks;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDeepseekModel> model, CudaDeepseekModel::Load(dir, lo));
  return std::unique_ptr<ModelBackend>(new CudaBackend(std::move(model)));
}

}  // namespace tandem
