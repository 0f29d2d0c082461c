#include "engine/model/deepseek_v4/cuda/cuda_v4_backend.h"

#include <algorithm>
#include <mutex>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_peer_kv.h"
#include "engine/model/deepseek_v4/v4_model_info.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/util/status_macros.h"

namespace tandem::v4 {
namespace {

using cuda_v4::CudaV4PeerKv;

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
  absl::Status PrepareDevicePool(const KvPool::Geometry& geometry) override { return model_->EnsurePool(geometry); }
  absl::StatusOr<DeviceKvPool> ShareKvPool() override {
    ASSIGN_OR_RETURN(CudaV4PeerKv * peer, Peer());
    return peer->Share(model_->pool()->geometry().num_blocks);
  }
  absl::StatusOr<std::unique_ptr<PeerKvWriter>> OpenPeerKv(const DeviceKvPool& pool,
                                                           std::vector<int32_t> /*dst_blocks*/) override {
    // (The destination's ranges come with each write: KvPool::SequenceExtents over the
    // peer's geometry, bounded by the mapping in the kernel.)
    ASSIGN_OR_RETURN(CudaV4PeerKv * peer, Peer());
    return peer->Open(pool);
  }
  absl::StatusOr<uint64_t> DeviceRangesChecksum(std::span<const KvExtent> ranges) override {
    ASSIGN_OR_RETURN(CudaV4PeerKv * peer, Peer());
    return peer->Checksum(ranges);
  }
  absl::Status KvToHost(int64_t, std::span<const int32_t>, int64_t, int64_t, KvPool&) override {
    return absl::UnimplementedError("DeepSeek-V4 on the GPU moves whole sequences (PoolRangesToHost)");
  }
  absl::Status KvFromHost(std::span<const int32_t>, int64_t, int64_t, KvPool&) override {
    return absl::UnimplementedError("DeepSeek-V4 on the GPU moves whole sequences (PoolRangesFromHost)");
  }

 private:
  // The pool's sharing, made on first use from any thread (the pool exists from
  // PrepareDevicePool on, at the engine's creation, and is never reallocated after: the
  // host pool's geometry does not change).
  absl::StatusOr<CudaV4PeerKv*> Peer() {
    std::lock_guard<std::mutex> lock(peer_mu_);
    if (peer_ == nullptr) {
      KvPool* pool = model_->pool();
      if (pool == nullptr) return absl::FailedPreconditionError("DeepSeek-V4's GPU KV pool is not allocated yet");
      ASSIGN_OR_RETURN(peer_, CudaV4PeerKv::Create(device_, pool->memory(), model_->stream()));
    }
    return peer_.get();
  }

  std::unique_ptr<cuda_v4::CudaV4Model> model_;
  ModelInfo info_;
  int device_ = 0;
  int64_t kv_blocks_ = 0;
  std::mutex peer_mu_;
  std::unique_ptr<CudaV4PeerKv> peer_;
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
  absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> model = cuda_v4::CudaV4Model::Load(dir, {.device = device, .fp8_gemm = options.fp8_prefill});
  if (!model.ok()) return model.status();
  int64_t blocks = options.kv_blocks;
  if (blocks <= 0) {
    // This process's share of the GPU, as V2/V3's (cuda_deepseek_model.cc): several replicas
    // may share one, each with its own fraction, so what this one holds (the weights) counts
    // against it and other processes' memory only through what is free. Less the
    // activations of the largest pass, the sequences' states and a reserve for the CUDA
    // context, cuBLAS's workspace and captured graphs, in blocks of every paged stream.
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::InternalError("cannot read the GPU's free memory");
    }
    constexpr double kReserve = 1 << 30;
    const std::vector<KvStream> streams = (*model)->kv_streams();
    const double own = static_cast<double>((*model)->weight_bytes());
    const double budget = std::min(static_cast<double>(total) * options.gpu_memory_utilization - own,
                                   static_cast<double>(free_bytes)) -
                          kReserve;
    const double states = static_cast<double>(SequenceStateBytes(streams)) * 3.0 * static_cast<double>(options.max_running);
    const double activations = 64.0 * 1024 * 1024 + static_cast<double>(options.max_batch_tokens) * 256 * 1024;
    const int64_t per_block = PagedBytesPerBlock(streams, static_cast<int32_t>(kKvBlockSize));
    blocks = per_block > 0 ? static_cast<int64_t>((budget - states - activations) / static_cast<double>(per_block)) : 0;
    if (blocks < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the GPU has no room for a KV cache at --gpu-memory-utilization ", options.gpu_memory_utilization, " (",
          (*model)->weight_bytes() >> 20, " MiB of DeepSeek-V4's weights, ", free_bytes >> 20, " MiB free of ",
          total >> 20, "): raise --gpu-memory-utilization or use a smaller model"));
    }
  }
  return std::unique_ptr<ModelBackend>(new V4CudaBackend(std::move(*model), device, blocks));
}

}  // namespace tandem::v4
