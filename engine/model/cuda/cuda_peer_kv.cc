#include "engine/model/cuda/cuda_peer_kv.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/kv_block_copy.h"

namespace tandem::cuda_model {
namespace {

constexpr int64_t kBlock = 64;

absl::Status CheckTable(std::span<const int32_t> table, int64_t num_blocks, int64_t max_blocks, const char* what) {
  if (static_cast<int64_t>(table.size()) > max_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", table.size(), " blocks, more than a sequence holds (",
                                                   max_blocks, ")"));
  }
  for (int32_t b : table) {
    if (b < 0 || b >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": block ", b, " outside the pool of ", num_blocks));
    }
  }
  return absl::OkStatus();
}

}  // namespace

class CudaPeerKv::Writer : public PeerKvWriter {
 public:
  Writer(CudaPeerKv* owner, int slot, std::shared_ptr<IpcMapping> mapping, int64_t dst_num_blocks,
         int64_t dst_positions)
      : owner_(owner), slot_(slot), mapping_(std::move(mapping)), dst_num_blocks_(dst_num_blocks),
        dst_positions_(dst_positions) {}
  ~Writer() override { owner_->ReleaseSlot(slot_); }

  absl::Status WriteLayer(int64_t layer, std::span<const int32_t> src_blocks, int64_t begin, int64_t end) override {
    const CudaDeepseekModel::KvPool& pool = owner_->pool_;
    if (end <= begin) return absl::OkStatus();
    if (layer < 0 || layer >= pool.num_layers || begin < 0 || end > dst_positions_ ||
        end > static_cast<int64_t>(src_blocks.size()) * kBlock) {
      return absl::InvalidArgumentError(absl::StrCat("peer KV write of layer ", layer, " positions [", begin, ", ",
                                                     end, ") outside the blocks"));
    }
    const cudaStream_t stream = owner_->model_stream_;
    if (pending_layers_ > 0 && (begin != pending_range_begin_ || end != pending_range_end_ ||
                                !std::equal(src_blocks.begin(), src_blocks.end(), last_src_.begin(), last_src_.end()))) {
      RETURN_IF_ERROR(Launch());  // a new step's range (the engine ends each step at the last layer)
    }
    if (!std::equal(src_blocks.begin(), src_blocks.end(), last_src_.begin(), last_src_.end())) {
      // A new block table: only between two Forwards (whose ends synchronize the stream),
      // so no earlier upload from the staging slot is still pending.
      RETURN_IF_ERROR(CheckTable(src_blocks, pool.num_blocks, pool.max_blocks_per_seq, "source block table"));
      int32_t* staging = owner_->host_tables_.get<int32_t>() + slot_ * pool.max_blocks_per_seq;
      std::memcpy(staging, src_blocks.data(), src_blocks.size_bytes());
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(owner_->DeviceTable(slot_, 0), staging, src_blocks.size_bytes(),
                                         cudaMemcpyHostToDevice, stream),
                         "uploading a block table");
      last_src_.assign(src_blocks.begin(), src_blocks.end());
    }
    if (pending_layers_ == 0) {
      pending_layer_begin_ = layer;
      pending_range_begin_ = begin;
      pending_range_end_ = end;
    } else if (layer != pending_layer_begin_ + pending_layers_) {
      RETURN_IF_ERROR(Launch());
      pending_layer_begin_ = layer;
    }
    ++pending_layers_;
    bytes_ += (end - begin) * pool.entry_bytes;
    // Layers go out in groups big enough to keep the link busy (kv_block_copy.h), and the
    // last layer always closes the step's group.
    if (pending_layers_ >= cuda::KvCopyLayersPerLaunch((end - begin) * pool.entry_bytes) ||
        layer + 1 == pool.num_layers) {
      return Launch();
    }
    return absl::OkStatus();
  }

  int64_t bytes() const override { return bytes_; }
  uint64_t checksum() const override {
    return *static_cast<volatile const uint64_t*>(owner_->host_sums_.get<uint64_t>() + slot_);
  }
  std::string path() const override {
    return mapping_->same_device() ? absl::StrCat("cuda-ipc (same GPU, cuda:", mapping_->device(), ")")
                                   : absl::StrCat("cuda-ipc (cuda:", mapping_->device(), " -> peer GPU)");
  }

 private:
  // Copies the pending layers (on the model's stream, after their KV writes).
  absl::Status Launch() {
    const CudaDeepseekModel::KvPool& pool = owner_->pool_;
    const cudaStream_t stream = owner_->model_stream_;
    const int64_t layer = pending_layer_begin_, layers = pending_layers_;
    const int64_t begin = pending_range_begin_, end = pending_range_end_;
    pending_layers_ = 0;
    unsigned long long* sum = owner_->sums_.get<unsigned long long>() + slot_;
    TANDEM_CUDA_RETURN(cuda::KvBlockCopy({.src = pool.base,
                                          .dst = mapping_->base(),
                                          .src_num_blocks = pool.num_blocks,
                                          .dst_num_blocks = dst_num_blocks_,
                                          .block_size = kBlock,
                                          .entry_bytes = pool.entry_bytes,
                                          .layer_begin = layer,
                                          .layer_end = layer + layers,
                                          .src_blocks = owner_->DeviceTable(slot_, 0),
                                          .dst_blocks = owner_->DeviceTable(slot_, 1),
                                          .begin = begin,
                                          .end = end,
                                          .checksum = sum},
                                         stream),
                       "copying KV to the peer");
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(owner_->host_sums_.get<uint64_t>() + slot_, sum, sizeof(uint64_t),
                                       cudaMemcpyDeviceToHost, stream),
                       "reading the KV checksum");
    return absl::OkStatus();
  }

  CudaPeerKv* owner_;
  int slot_;
  std::shared_ptr<IpcMapping> mapping_;
  int64_t dst_num_blocks_;
  int64_t dst_positions_;
  std::vector<int32_t> last_src_;
  int64_t bytes_ = 0;
  // Layers [pending_layer_begin_, + pending_layers_) of positions [pending_range_begin_,
  // pending_range_end_), computed but not yet copied.
  int64_t pending_layer_begin_ = 0, pending_layers_ = 0;
  int64_t pending_range_begin_ = 0, pending_range_end_ = 0;
};

absl::StatusOr<std::unique_ptr<CudaPeerKv>> CudaPeerKv::Create(const CudaDeepseekModel::KvPool& pool,
                                                               void* model_stream, int64_t max_writers) {
  std::unique_ptr<CudaPeerKv> p(new CudaPeerKv(pool, static_cast<cudaStream_t>(model_stream)));
  TANDEM_CUDA_RETURN(cudaSetDevice(pool.device), "selecting the GPU");
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&p->side_stream_, cudaStreamNonBlocking), "creating a stream");
  const size_t table = static_cast<size_t>(pool.max_blocks_per_seq) * sizeof(int32_t);
  RETURN_IF_ERROR(p->tables_.Allocate(max_writers * 2 * table, "peer KV block tables"));
  RETURN_IF_ERROR(p->sums_.Allocate(max_writers * sizeof(uint64_t), "peer KV checksums"));
  RETURN_IF_ERROR(p->host_tables_.Allocate(max_writers * table, "peer KV block tables"));
  RETURN_IF_ERROR(p->host_sums_.Allocate(max_writers * sizeof(uint64_t), "peer KV checksums"));
  RETURN_IF_ERROR(p->verify_table_.Allocate(table, "KV verification"));
  RETURN_IF_ERROR(p->verify_sum_.Allocate(sizeof(uint64_t), "KV verification"));
  RETURN_IF_ERROR(p->verify_host_.Allocate(sizeof(uint64_t), "KV verification"));
  for (int64_t s = max_writers - 1; s >= 0; --s) p->free_slots_.push_back(static_cast<int>(s));
  return p;
}

CudaPeerKv::~CudaPeerKv() {
  if (side_stream_ != nullptr) {
    cudaStreamSynchronize(side_stream_);
    cudaStreamDestroy(side_stream_);
  }
}

absl::StatusOr<DeviceKvPool> CudaPeerKv::Share() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!shared_) {
    ASSIGN_OR_RETURN(IpcPoolDescriptor d, ExportIpcPool(pool_.base, pool_.bytes, pool_.device));
    shared_ = DeviceKvPool{.host_id = d.host_id,
                           .device_uuid = d.device_uuid,
                           .ipc_handle = d.handle,
                           .bytes = d.bytes,
                           .num_blocks = pool_.num_blocks,
                           .bytes_per_value = 2,
                           .pid = d.pid};
  }
  return *shared_;
}

absl::StatusOr<std::unique_ptr<PeerKvWriter>> CudaPeerKv::Open(const DeviceKvPool& peer,
                                                               std::vector<int32_t> dst_blocks) {
  if (peer.bytes_per_value != 2) {
    return absl::FailedPreconditionError(absl::StrCat("peer KV pool holds ", peer.bytes_per_value,
                                                      "-byte values, this one bf16"));
  }
  RETURN_IF_ERROR(CheckPeerGeometry(peer.num_blocks, peer.bytes));
  RETURN_IF_ERROR(CheckTable(dst_blocks, peer.num_blocks, pool_.max_blocks_per_seq, "destination block table"));
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_CUDA_RETURN(cudaSetDevice(pool_.device), "selecting the GPU");
  ASSIGN_OR_RETURN(std::shared_ptr<IpcMapping> mapping,
                   mappings_.Map({.host_id = peer.host_id, .device_uuid = peer.device_uuid, .handle = peer.ipc_handle,
                                  .bytes = peer.bytes, .pid = peer.pid},
                                 pool_.device));
  // Again against the mapping's real extent (cuMemGetAddressRange, cuda_ipc.h): the copies
  // address dst + ((layer * num_blocks + block) * 64 + slot) * entry_bytes, so num_blocks
  // blocks of every layer must lie inside what is mapped, whatever the message said.
  RETURN_IF_ERROR(CheckPeerGeometry(peer.num_blocks, mapping->bytes()));
  if (free_slots_.empty()) return absl::ResourceExhaustedError("too many device KV transfers in flight");
  const int slot = free_slots_.back();
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(DeviceTable(slot, 1), dst_blocks.data(), dst_blocks.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, side_stream_),
                     "uploading a block table");
  TANDEM_CUDA_RETURN(cudaMemsetAsync(sums_.get<uint64_t>() + slot, 0, sizeof(uint64_t), side_stream_),
                     "clearing a checksum");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(side_stream_), "preparing a peer KV transfer");
  host_sums_.get<uint64_t>()[slot] = 0;
  free_slots_.pop_back();
  return std::unique_ptr<PeerKvWriter>(
      new Writer(this, slot, std::move(mapping), peer.num_blocks, static_cast<int64_t>(dst_blocks.size()) * kBlock));
}

absl::Status CudaPeerKv::CheckPeerGeometry(int64_t num_blocks, uint64_t bytes) const {
  const uint64_t per_block = static_cast<uint64_t>(pool_.num_layers) * kBlock * static_cast<uint64_t>(pool_.entry_bytes);
  // Division, not multiplication: a forged block count must not overflow into a small product.
  if (num_blocks <= 0 || per_block == 0 || static_cast<uint64_t>(num_blocks) > bytes / per_block) {
    return absl::InvalidArgumentError(absl::StrCat("peer KV pool of ", bytes, " bytes cannot hold ", num_blocks,
                                                   " blocks of this model"));
  }
  return absl::OkStatus();
}

void CudaPeerKv::ReleaseSlot(int slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_slots_.push_back(slot);
}

absl::StatusOr<uint64_t> CudaPeerKv::Checksum(std::span<const int32_t> blocks, int64_t num_tokens) {
  if (num_tokens < 0 || num_tokens > static_cast<int64_t>(blocks.size()) * kBlock) {
    return absl::InvalidArgumentError(absl::StrCat(num_tokens, " positions beyond ", blocks.size(), " blocks"));
  }
  RETURN_IF_ERROR(CheckTable(blocks, pool_.num_blocks, pool_.max_blocks_per_seq, "block table"));
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_CUDA_RETURN(cudaSetDevice(pool_.device), "selecting the GPU");
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(verify_table_.get(), blocks.data(), blocks.size_bytes(), cudaMemcpyHostToDevice,
                                     side_stream_),
                     "uploading a block table");
  TANDEM_CUDA_RETURN(cudaMemsetAsync(verify_sum_.get(), 0, sizeof(uint64_t), side_stream_), "clearing a checksum");
  TANDEM_CUDA_RETURN(cuda::KvBlockCopy({.src = pool_.base,
                                        .dst = nullptr,
                                        .src_num_blocks = pool_.num_blocks,
                                        .dst_num_blocks = 0,
                                        .block_size = kBlock,
                                        .entry_bytes = pool_.entry_bytes,
                                        .layer_begin = 0,
                                        .layer_end = pool_.num_layers,
                                        .src_blocks = verify_table_.get<int32_t>(),
                                        .dst_blocks = nullptr,
                                        .begin = 0,
                                        .end = num_tokens,
                                        .checksum = verify_sum_.get<unsigned long long>()},
                                       side_stream_),
                     "checksumming KV");
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(verify_host_.get(), verify_sum_.get(), sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                     side_stream_),
                     "reading a checksum");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(side_stream_), "checksumming KV");
  return *verify_host_.get<uint64_t>();
}

}  // namespace tandem::cuda_model
