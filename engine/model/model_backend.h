// What the engine runs the model on (docs/design.md §7): the CPU reference (DeepseekModel) or
// a device backend (engine/model/cuda). The engine always owns a host KV pool
// (LatentKvCache, float32): the memory the transfer layer registers and that KV export
// and import read and write. The CPU backend computes in that pool directly. A device
// backend keeps its own pool with the same block ids and moves entries between the two
// only where the engine asks: KvToHost after a layer of a prefill whose KV is exported,
// KvFromHost before the first step of a request whose KV was imported.
//
// Between two processes of one machine, device backends can also move KV device to device
// (CUDA IPC, docs/design.md §5): the decode side shares its device pool (ShareKvPool), the
// prefill side opens a PeerKvWriter into the reserved blocks of that pool and the engine
// gives it each layer's positions as they are computed; no host pool is involved.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/kv_pool.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/model_info.h"

namespace tandem {

// A device KV pool another process of this machine may map (CUDA IPC): what a decode
// replica hands prefill replicas, next to its host pool's transfer descriptor.
struct DeviceKvPool {
  std::string host_id;      // the machine (boot id): IPC works within one OS instance
  std::string device_uuid;  // the GPU holding the pool (16 bytes)
  std::string ipc_handle;   // the driver's handle of the allocation (opaque bytes)
  uint64_t bytes = 0;       // the allocation's length
  int64_t num_blocks = 0;   // blocks per layer; layout [layer][block][block_size][entry]
  int32_t bytes_per_value = 0;
  int32_t pid = 0;          // the process that shares it
};

// Writes one request's KV into reserved blocks of a peer's device pool.
class PeerKvWriter {
 public:
  virtual ~PeerKvWriter() = default;
  // Engine thread, from Forward's after_layer_kv: enqueues the copy of positions
  // [begin, end) of `layer` from this backend's pool (the sequence's `src_blocks`) into
  // the peer's blocks, after the layer's own KV writes. The copies are complete, and
  // visible to the peer, when that Forward returns.
  virtual absl::Status WriteLayer(int64_t layer, std::span<const int32_t> src_blocks, int64_t begin,
                                  int64_t end) = 0;
  // After the last Forward that wrote: the bytes written and their checksum (the sum of
  // kernels/cuda/kv_block_copy.h's KvEntryChecksum over every entry written).
  virtual int64_t bytes() const = 0;
  virtual uint64_t checksum() const = 0;
  virtual std::string path() const = 0;  // "cuda-ipc (cuda:0 -> peer GPU)", for logs
  // Layouts other than one latent stream (DeepSeek-V4), whose sequences move whole once
  // their prompt is computed: whether this writer takes WriteRanges (then never
  // WriteLayer).
  virtual bool writes_ranges() const { return false; }
  // Engine thread, after the step that computed the prompt's last token: copies each of
  // `src` (ranges of this backend's device pool, KvPool::SequenceExtents) to its
  // counterpart in `dst` (the same list over the peer's pool: equal lengths and layers),
  // complete and visible to the peer when it returns; bytes() and checksum() then cover
  // them (the checksum of kernels/cuda/kv_extent_copy.h).
  virtual absl::Status WriteRanges(std::span<const KvExtent> /*src*/, std::span<const KvExtent> /*dst*/) {
    return absl::UnimplementedError("this writer copies layers, not ranges");
  }
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // What the engine needs of the model; a backend returns its architecture's config
  // (covariant: DeepSeek-V2/V3's ModelConfig).
  virtual const ModelInfo& config() const = 0;
  // "cpu", "cuda:0", ...
  virtual std::string device_name() const = 0;
  // True when Forward computes in the host pool itself (no KvToHost/KvFromHost needed).
  virtual bool kv_in_host_pool() const = 0;
  // Blocks the backend's own pool holds (device backends); 0: no limit of its own.
  virtual int64_t device_kv_blocks() const { return 0; }
  // Data-parallel attention (docs/parallel.md): how many ranks hold KV pools of their own;
  // each is an equal range of the host pool's blocks (rank r: ids [r N, (r + 1) N) of D N),
  // the engine keeps the blocks of all of them and tells Forward which rank holds each
  // sequence (ForwardSequence::dp_rank). 1: one pool, `host`.
  virtual int data_parallel_ranks() const { return 1; }
  // Memory the engine's host pool must be created over, from its start (the ranks of a
  // group map it too, so that KV imported or exported by block ids is every rank's);
  // empty: wherever the engine likes.
  virtual std::span<std::byte> shared_host_pool() { return {}; }

  // DeepseekModel::Forward's contract; `host` is the engine's pool, holding the streams of
  // the model's KV layout (DeepSeek-V2/V3 view its one latent stream: LatentKvCache::Of).
  virtual absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                                     const ForwardOptions& options) = 0;

  // Whether ForwardSample works: the tokens are chosen on the device and only they cross to
  // the host (no logits copy, no CPU sampling).
  virtual bool samples_on_device() const { return false; }
  // Forward, then one token per logits row (rows[i] for logits row i), with the CPU
  // Sampler's choice from the same logits.
  virtual absl::StatusOr<std::vector<int32_t>> ForwardSample(std::span<const ForwardSequence> /*batch*/,
                                                             KvPool& /*host*/,
                                                             std::span<const SampleRow> /*rows*/,
                                                             const ForwardOptions& /*options*/) {
    return absl::UnimplementedError("this backend samples on the host");
  }
  // ForwardSample in two halves, so that the engine prepares the next step while this one
  // computes: LaunchSample takes everything it needs from its arguments before returning
  // (the caller may then change the sequences' tokens, block tables and the host pool's
  // bookkeeping); CollectSample waits for that step's tokens. One step at a time: each
  // LaunchSample is followed by one CollectSample before the next LaunchSample; other
  // calls in between (KvToHost, Forward, ...) are ordered after the launched step. A
  // launch error is returned by LaunchSample or by CollectSample. This default computes
  // in LaunchSample.
  virtual absl::Status LaunchSample(std::span<const ForwardSequence> batch, KvPool& host,
                                    std::span<const SampleRow> rows, const ForwardOptions& options) {
    launched_ = ForwardSample(batch, host, rows, options);
    return absl::OkStatus();
  }
  virtual absl::StatusOr<std::vector<int32_t>> CollectSample() {
    absl::StatusOr<std::vector<int32_t>> r = std::move(launched_);
    launched_ = absl::FailedPreconditionError("no step launched");
    return r;
  }

  // Speculative decoding (docs/speculative-decoding.md): whether the backend was loaded with
  // its MTP layer (BackendOptions::mtp), whose KV is then the pool's last layer.
  virtual bool has_mtp() const { return false; }
  // The draft pass (DeepseekModel::Draft's contract): per sequence its drafts, in order.
  virtual absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> /*batch*/,
                                                                     KvPool& /*host*/) {
    return absl::UnimplementedError("this backend has no MTP layer loaded");
  }
  // After a Forward in which the sequence of `state_slot` verified num_drafts drafts
  // (ForwardSequence::num_drafts): `accepted` of them stood, and its state moves past them.
  // Before any other call that reads the slot. Backends whose KV is one entry per position
  // need nothing (a refused draft's entry is overwritten later).
  virtual absl::Status AcceptDrafts(int64_t /*state_slot*/, int32_t /*accepted*/) { return absl::OkStatus(); }
  // Row `row` of the hidden states the last Forward kept (ForwardSequence::keep_hidden):
  // config().mtp_hidden_size() floats, for a prefill replica to hand over with the first token.
  virtual absl::StatusOr<std::vector<float>> KeptHidden(int64_t /*row*/) const {
    return absl::UnimplementedError("this backend has no MTP layer loaded");
  }

  // Device backends: copy positions [begin, end) of a sequence (its block table) between
  // the device pool and the host pool: one layer to the host, every layer from it.
  virtual absl::Status KvToHost(int64_t /*layer*/, std::span<const int32_t> /*block_table*/, int64_t /*begin*/,
                                int64_t /*end*/, KvPool& /*host*/) {
    return absl::OkStatus();
  }
  virtual absl::Status KvFromHost(std::span<const int32_t> /*block_table*/, int64_t /*begin*/, int64_t /*end*/,
                                  KvPool& /*host*/) {
    return absl::OkStatus();
  }

  // Device backends whose pool holds per-sequence streams (DeepSeek-V4 on a GPU) keep it in
  // the host pool's layout byte for byte (same streams and geometry). The engine moves what
  // leaves or enters the replica through the host pool: ranges of the pool (offsets from
  // its first byte, as KvPool::SequenceExtents gives them) copied to or from the host pool,
  // and state slots copied within the device pool (the prefix cache's snapshots).
  virtual absl::Status PoolRangesToHost(std::span<const KvExtent> /*ranges*/, KvPool& /*host*/) {
    return absl::UnimplementedError("this backend's KV pool has no host mirror");
  }
  virtual absl::Status PoolRangesFromHost(std::span<const KvExtent> /*ranges*/, KvPool& /*host*/) {
    return absl::UnimplementedError("this backend's KV pool has no host mirror");
  }
  virtual absl::Status CopyStateSlot(int64_t /*from*/, int64_t /*to*/) {
    return absl::UnimplementedError("this backend's KV pool has no host mirror");
  }
  // Device-to-device transfer; the CPU backend has none (UNIMPLEMENTED). Thread-safe: the
  // services call these next to the engine thread's Forward.
  // Decode side: the device pool as peers map it.
  virtual absl::StatusOr<DeviceKvPool> ShareKvPool() { return absl::UnimplementedError("no device KV pool"); }
  // Prefill side: a writer into `dst_blocks` of a peer's `pool` (position p in
  // dst_blocks[p / block_size]). FAILED_PRECONDITION, saying why, when this process cannot
  // map it (another machine, an unreachable GPU): the caller takes another path.
  virtual absl::StatusOr<std::unique_ptr<PeerKvWriter>> OpenPeerKv(const DeviceKvPool& /*pool*/,
                                                                   std::vector<int32_t> /*dst_blocks*/) {
    return absl::UnimplementedError("no device KV pool");
  }
  // Decode side: the checksum of positions [0, num_tokens) of every layer of a sequence's
  // blocks in the device pool (PeerKvWriter::checksum's function), to check what arrived.
  virtual absl::StatusOr<uint64_t> DeviceKvChecksum(std::span<const int32_t> /*blocks*/, int64_t /*num_tokens*/) {
    return absl::UnimplementedError("no device KV pool");
  }
  // Decode side, layouts other than one latent stream: the checksum of `ranges` of the
  // device pool (a sequence's KvPool::SequenceExtents; PeerKvWriter::WriteRanges's
  // function).
  virtual absl::StatusOr<uint64_t> DeviceRangesChecksum(std::span<const KvExtent> /*ranges*/) {
    return absl::UnimplementedError("no device KV pool");
  }
  // A backend that computes in a device pool mirroring the host pool's layout (DeepSeek-V4
  // on a GPU) allocates it now, with the host pool's geometry, rather than at the first
  // Forward: ShareKvPool offers it before any step. Engine::Create calls it once.
  virtual absl::Status PrepareDevicePool(const KvPool::Geometry& /*geometry*/) { return absl::OkStatus(); }

 private:
  absl::StatusOr<std::vector<int32_t>> launched_ = absl::FailedPreconditionError("no step launched");
};

// The CPU reference backend.
class CpuBackend : public ModelBackend {
 public:
  explicit CpuBackend(std::unique_ptr<DeepseekModel> model) : model_(std::move(model)) {}
  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return "cpu"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& host,
                                             const ForwardOptions& options) override {
    LatentKvCache cache = LatentKvCache::Of(host);
    return model_->Forward(batch, cache, ForDeepseek(options));
  }
  bool has_mtp() const override { return model_->has_mtp(); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& host) override {
    LatentKvCache cache = LatentKvCache::Of(host);
    return model_->Draft(batch, cache);
  }
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row) const override;
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
  // A sequence's logits bitwise the same whatever else is in the batch and however its
  // prompt is chunked (docs/batch-invariance.md). The CPU backend always is; a backend that
  // cannot be refuses to load (FAILED_PRECONDITION naming --batch-invariant).
  bool batch_invariant = false;
  // cuda, FP8 checkpoints: decode steps multiply the stored FP8 weights
  // (CudaDeepseekModel::LoadOptions::fp8_decode).
  bool fp8_decode = false;
  // cuda, FP8 checkpoints: passes of at least 128 tokens multiply the FP8 matrices on the FP8
  // tensor cores, their activations quantized per token and 128 columns as DeepSeek's
  // inference code does (V2/V3: CudaDeepseekModel::LoadOptions::fp8_prefill; V4:
  // cuda_v4::CudaV4Model::Options::fp8_gemm). Ignored with batch_invariant.
  bool fp8_prefill = false;
  // Speculative decoding: load the checkpoint's MTP layer (ModelBackend::has_mtp); the
  // engine's pool then has its KV as one more layer (KvStreamOptions::mtp).
  bool mtp = false;
};

// CUDA devices this process sees (0 in a build without CUDA, or without a driver or GPU).
int CudaDeviceCount();

// Loads a DeepSeek-V2/V3 checkpoint in `dir` onto the device of `options` (the
// architectures' registry, engine/architectures, picks it by model_type). A CUDA device
// in a build without CUDA, or on a machine without a usable GPU, is FAILED_PRECONDITION
// saying why.
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadDeepseekBackend(const std::string& dir,
                                                                  const BackendOptions& options);

}  // namespace tandem
