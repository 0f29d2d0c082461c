#include "engine/model/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <cuda_runtime.h>

#include "engine/model/checkpoint.h"
#include "engine/model/cuda/cuda_deepseek_model.h"
#include "engine/model/cuda/cuda_peer_kv.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

class CudaBackend : public ModelBackend {
 public:
  CudaBackend(std::unique_ptr<CudaDeepseekModel> model, std::unique_ptr<cuda_model::CudaPeerKv> peer_kv)
      : model_(std::move(model)), peer_kv_(std::move(peer_kv)) {
    // TANDEM_GPU_STEP_TRACE=N: every N steps, how much of the time between the GPU's first
    // and last operation of those steps it was busy, on stderr: the GPU idle time the
    // engine leaves between steps, as served.
    if (const char* t = std::getenv("TANDEM_GPU_STEP_TRACE"); t != nullptr && std::atoi(t) > 0) {
      trace_every_ = std::atoi(t);
      model_->set_step_events(true);
    }
  }

  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return model_->device_name(); }
  bool kv_in_host_pool() const override { return false; }
  int64_t device_kv_blocks() const override { return model_->num_blocks(); }

  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& /*host*/,
                                             const ForwardOptions& options) override {
    TraceEnter();
    absl::StatusOr<std::vector<float>> r = model_->Forward(batch, ForDeepseek(options));
    Trace();
    return r;
  }

  bool samples_on_device() const override { return true; }
  absl::StatusOr<std::vector<int32_t>> ForwardSample(std::span<const ForwardSequence> batch, KvPool& /*host*/,
                                                     std::span<const SampleRow> rows,
                                                     const ForwardOptions& options) override {
    TraceEnter();
    absl::StatusOr<std::vector<int32_t>> r = model_->ForwardSample(batch, rows, ForDeepseek(options));
    Trace();
    return r;
  }

  absl::Status LaunchSample(std::span<const ForwardSequence> batch, KvPool& /*host*/,
                            std::span<const SampleRow> rows, const ForwardOptions& options) override {
    TraceEnter();
    return model_->LaunchSample(batch, rows, ForDeepseek(options));
  }
  absl::StatusOr<std::vector<int32_t>> CollectSample() override {
    absl::StatusOr<std::vector<int32_t>> r = model_->CollectSample();
    Trace();
    return r;
  }

  // One device read (or write) per layer through a contiguous buffer, scattered to (or
  // gathered from) the host pool's blocks: a synchronization per 4096 positions rather
  // than one per block.
  absl::Status KvToHost(int64_t layer, std::span<const int32_t> table, int64_t begin, int64_t end,
                        KvPool& pool) override {
    if (end <= begin) return absl::OkStatus();
    LatentKvCache host = LatentKvCache::Of(pool);
    const int64_t dim = host.entry_dim();
    staging_.resize(static_cast<size_t>((end - begin) * dim));
    RETURN_IF_ERROR(model_->ReadKvEntries(layer, table, begin, end - begin, staging_.data()));
    return ForEachBlockRun(table, begin, end, host, [&](int64_t p, int64_t n) {
      std::memcpy(host.Entry(layer, table, p), staging_.data() + (p - begin) * dim, n * dim * sizeof(float));
      return absl::OkStatus();
    });
  }

  absl::Status KvFromHost(std::span<const int32_t> table, int64_t begin, int64_t end, KvPool& pool) override {
    if (end <= begin) return absl::OkStatus();
    LatentKvCache host = LatentKvCache::Of(pool);
    const int64_t dim = host.entry_dim();
    staging_.resize(static_cast<size_t>((end - begin) * dim));
    for (int64_t layer = 0; layer < host.num_layers(); ++layer) {
      RETURN_IF_ERROR(ForEachBlockRun(table, begin, end, host, [&](int64_t p, int64_t n) {
        std::memcpy(staging_.data() + (p - begin) * dim, host.Entry(layer, table, p), n * dim * sizeof(float));
        return absl::OkStatus();
      }));
      RETURN_IF_ERROR(model_->WriteKvEntries(layer, table, begin, staging_.data(), end - begin));
    }
    return absl::OkStatus();
  }

  bool has_mtp() const override { return model_->has_mtp(); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& /*host*/) override {
    return model_->Draft(batch);
  }
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const override { return model_->KeptHidden(row); }

  absl::StatusOr<DeviceKvPool> ShareKvPool() override { return peer_kv_->Share(); }
  absl::StatusOr<std::unique_ptr<PeerKvWriter>> OpenPeerKv(const DeviceKvPool& pool,
                                                           std::vector<int32_t> dst_blocks) override {
    return peer_kv_->Open(pool, std::move(dst_blocks));
  }
  absl::StatusOr<uint64_t> DeviceKvChecksum(std::span<const int32_t> blocks, int64_t num_tokens) override {
    return peer_kv_->Checksum(blocks, num_tokens);
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

  // Host time between two forward passes (the engine's) vs inside them.
  void TraceEnter() {
    if (trace_every_ == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (traced_ > 0) outside_s_ += std::chrono::duration<double>(now - last_exit_).count();
    last_enter_ = now;
  }
  void Trace() {
    if (trace_every_ == 0) return;
    last_exit_ = std::chrono::steady_clock::now();
    inside_s_ += std::chrono::duration<double>(last_exit_ - last_enter_).count();
    if (++traced_ % trace_every_ != 0) return;
    const double outside_ms = outside_s_ * 1e3 / static_cast<double>(trace_every_);
    const double inside_ms = inside_s_ * 1e3 / static_cast<double>(trace_every_);
    outside_s_ = inside_s_ = 0;
    absl::StatusOr<std::vector<std::pair<double, double>>> t = model_->TakeStepTimes();
    if (!t.ok() || t->empty()) return;
    double busy = 0;
    std::vector<double> gaps;
    for (size_t i = 0; i < t->size(); ++i) {
      busy += (*t)[i].second - (*t)[i].first;
      if (i > 0) gaps.push_back((*t)[i].first - (*t)[i - 1].second);
    }
    const double span = t->back().second - t->front().first;
    std::sort(gaps.begin(), gaps.end());
    std::fprintf(stderr,
                 "gpu step trace: %zu steps, GPU busy %.1f%% of %.1f ms, mean step %.3f ms, median gap %.3f ms; "
                 "host per step: %.3f ms in the forward pass, %.3f ms between passes\n",
                 t->size(), 100.0 * busy / span, span, busy / static_cast<double>(t->size()),
                 gaps.empty() ? 0.0 : gaps[gaps.size() / 2], inside_ms, outside_ms);
  }

  std::unique_ptr<CudaDeepseekModel> model_;
  std::unique_ptr<cuda_model::CudaPeerKv> peer_kv_;
  int64_t trace_every_ = 0, traced_ = 0;
  std::chrono::steady_clock::time_point last_enter_, last_exit_;
  double inside_s_ = 0, outside_s_ = 0;
  std::vector<float> staging_;  // engine thread only
};

// Device-to-device transfers that may be open at once (requests waiting for a prefill
// hold one): beyond, requests take the host path.
constexpr int64_t kMaxPeerKvWriters = 1024;

}  // namespace

int CudaDevicesVisible() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadCudaBackend(const std::string& dir, const BackendOptions& options,
                                                              int device_index) {
  CudaDeepseekModel::LoadOptions lo;
  lo.mtp = options.mtp;
  lo.device = device_index;
  lo.batch_invariant = options.batch_invariant;
  lo.fp8_decode = options.fp8_decode;
  lo.fp8_prefill = options.fp8_prefill;
  lo.max_batch_tokens = options.max_batch_tokens;
  lo.max_seqs = options.max_running;
  lo.gpu_memory_utilization = options.gpu_memory_utilization;
  lo.kv_blocks = options.kv_blocks;
  std::unique_ptr<CudaDeepseekModel> model;
  const std::filesystem::path generated = std::filesystem::path(dir) / kGeneratedWeightsFile;
  std::error_code ec;
  if (std::filesystem::exists(generated, ec)) {
    ASSIGN_OR_RETURN(std::string marker, ReadFileToString(generated.string()));
    ASSIGN_OR_RETURN(std::string config, ReadFileToString((std::filesystem::path(dir) / "config.json").string()));
    const nlohmann::json j = nlohmann::json::parse(marker, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("seed") || !j["seed"].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(generated.string(), ": expected {\"seed\": N}"));
    }
    ASSIGN_OR_RETURN(model, CudaDeepseekModel::CreateGenerated(config, j["seed"].get<uint64_t>(), lo));
  } else {
    ASSIGN_OR_RETURN(model, CudaDeepseekModel::Load(dir, lo));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<cuda_model::CudaPeerKv> peer_kv,
                   cuda_model::CudaPeerKv::Create(model->kv_pool(), model->stream(), kMaxPeerKvWriters));
  return std::unique_ptr<ModelBackend>(new CudaBackend(std::move(model), std::move(peer_kv)));
}

}  // namespace tandem
