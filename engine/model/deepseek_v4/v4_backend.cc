#include "engine/model/deepseek_v4/v4_backend.h"

#include "absl/strings/str_cat.h"

namespace tandem::v4 {

ModelInfo V4ModelInfo(const DeepseekV4Config& c) {
  return {.model_type = "deepseek_v4",
          .vocab_size = c.vocab_size,
          .hidden_size = c.hidden_size,
          .num_hidden_layers = c.num_hidden_layers,
          .max_position_embeddings = c.max_position_embeddings,
          .tie_word_embeddings = c.tie_word_embeddings,
          .bos_token_id = c.bos_token_id,
          .eos_token_ids = c.eos_token_ids,
          .summary = c.Summary(),
          .hidden_streams = c.hc_mult};
}

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
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", options.device,
        ": DeepSeek-V4 runs on the CPU only in this build (its GPU kernels are not written yet); use --device cpu"));
  }
  absl::StatusOr<std::unique_ptr<PagedV4Model>> model =
      PagedV4Model::Load(dir, {.num_threads = options.num_threads, .mtp = options.mtp});
  if (!model.ok()) return model.status();
  return std::unique_ptr<ModelBackend>(new V4CpuBackend(std::move(*model)));
}

}  // namespace tandem::v4
