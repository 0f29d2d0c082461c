#include "engine/model/deepseek_v4/v4_backend.h"

#include "absl/strings/str_cat.h"

#if TANDEM_HAVE_CUDA
#include "engine/model/deepseek_v4/cuda/cuda_v4_backend.h"
#endif

namespace tandem::v4 {

namespace {

class V4CpuBackend : public ModelBackend {
 public:
  explicit V4CpuBackend(std::unique_ptr<PagedV4Model> model)
      : model_(std::move(model)), info_(V4ModelInfo(model_->config())) {}
  const ModelInfo& config() const override { return info_; }
  std::string device_name() const override { return "cpu"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    host_ = &host;
    return model_->Forward(batch, host, options);
  }
  bool has_mtp() const override { return model_->mtp(); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& host) override {
    return model_->Draft(batch, host);
  }
  absl::Status AcceptDrafts(int64_t state_slot, int32_t accepted) override {
    if (host_ == nullptr) return absl::FailedPreconditionError("no pass verified drafts");
    return model_->AcceptDrafts(state_slot, accepted, *host_);
  }
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const override { return model_->KeptHidden(row); }

 private:
  std::unique_ptr<PagedV4Model> model_;
  ModelInfo info_;
  KvPool* host_ = nullptr;  // the pool of the last Forward (AcceptDrafts writes there)
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadV4Backend(const std::string& dir, const BackendOptions& options) {
  absl::StatusOr<DeviceSpec> device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  if (device->kind != DeviceSpec::Kind::kCpu) {
#if TANDEM_HAVE_CUDA
    return LoadV4CudaBackend(dir, options, device->index);
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", options.device, ": this build of Tandem has no CUDA backend (built without nvcc)"));
#endif
  }
  absl::StatusOr<std::unique_ptr<PagedV4Model>> model =
      PagedV4Model::Load(dir, {.num_threads = options.num_threads, .mtp = options.mtp});
  if (!model.ok()) return model.status();
  return std::unique_ptr<ModelBackend>(new V4CpuBackend(std::move(*model)));
}

}  // namespace tandem::v4
