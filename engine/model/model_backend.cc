#include "engine/model/model_backend.h"

#include <charconv>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/model/checkpoint.h"
#include "engine/util/status_macros.h"

#if TANDEM_HAVE_CUDA
#include "engine/model/cuda/cuda_backend.h"
#endif

namespace tandem {

absl::StatusOr<DeviceSpec> ParseDevice(const std::string& device) {
  if (device == "cpu") return DeviceSpec{};
  if (device == "cuda") return DeviceSpec{.kind = DeviceSpec::Kind::kCuda, .index = 0};
  if (device.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* b = device.data() + 5;
    const char* e = device.data() + device.size();
    auto [p, ec] = std::from_chars(b, e, index);
    if (ec == std::errc() && p == e && b != e && index >= 0) {
      return DeviceSpec{.kind = DeviceSpec::Kind::kCuda, .index = index};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device: '", device, "' is not a device; use cpu, cuda or cuda:N"));
}

int CudaDeviceCount() {
#if TANDEM_HAVE_CUDA
  return CudaDevicesVisible();
#else
  return 0;
#endif
}

absl::StatusOr<std::vector<float>> CpuBackend::KeptHidden(int64_t row) const {
  const int64_t d = model_->config().hidden_size;
  const std::span<const float> kept = model_->kept_hidden();
  if (row < 0 || (row + 1) * d > static_cast<int64_t>(kept.size())) {
    return absl::InvalidArgumentError(absl::StrCat("hidden row ", row, " was not kept"));
  }
  return std::vector<float>(kept.begin() + row * d, kept.begin() + (row + 1) * d);
}

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadDeepseekBackend(const std::string& dir, const BackendOptions& options) {
  ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(options.device));
  if (spec.kind == DeviceSpec::Kind::kCpu) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(dir) / kGeneratedWeightsFile, ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": its weights are generated on the GPU at load (make-model --weights-on-gpu): use --device cuda"));
    }
    DeepseekModel::LoadOptions load;
    load.num_threads = options.num_threads;
    load.mtp = options.mtp;
    ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model, DeepseekModel::Load(dir, load));
    return std::unique_ptr<ModelBackend>(new CpuBackend(std::move(model)));
  }
#if TANDEM_HAVE_CUDA
  return LoadCudaBackend(dir, options, spec.index);
#else
  return absl::FailedPreconditionError(
      absl::StrCat("--device ", options.device, ": this build of Tandem has no CUDA backend (built without nvcc)"));
#endif
}

}  // namespace tandem
