#include "engine/model/deepseek_v4/cuda/cuda_v4_peer_kv.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/kv_extent_copy.h"

namespace tandem::v4::cuda_v4 {
namespace {

// What one KvExtentCopy reports back.
struct CopyResult {
  unsigned long long checksum = 0;
  int32_t bad_extent = 0;
  int32_t padding = 0;
};

// Runs KvExtentCopy over `pairs` on `stream` and waits for it. The pairs' table lives in
// a stream-ordered allocation: cudaMalloc would synchronize the whole device, the model's
// passes included.
absl::StatusOr<uint64_t> CopyExtents(std::vector<cuda::KvExtentPair> pairs, std::span<const std::byte> src,
                                     std::byte* dst, uint64_t dst_bytes, cudaStream_t stream) {
  const uint64_t words = cuda::NumberKvExtentWords(pairs);
  if (pairs.empty()) return 0;
  const size_t table = pairs.size() * sizeof(cuda::KvExtentPair);
  void* memory = nullptr;
  TANDEM_CUDA_RETURN(cudaMallocAsync(&memory, table + sizeof(CopyResult), stream), "allocating a KV range table");
  auto* device_pairs = static_cast<cuda::KvExtentPair*>(memory);
  auto* device_result = reinterpret_cast<CopyResult*>(static_cast<std::byte*>(memory) + table);
  CopyResult result;
  // (Pageable copies: the table is staged before the call returns, the result read after
  // the kernel.)
  cudaError_t err = cudaMemcpyAsync(device_pairs, pairs.data(), table, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(device_result, 0, sizeof(CopyResult), stream);
  if (err == cudaSuccess) {
    err = cuda::KvExtentCopy({.src = src.data(),
                              .src_bytes = src.size(),
                              .dst = dst,
                              .dst_bytes = dst_bytes,
                              .extents = device_pairs,
                              .num_extents = static_cast<int64_t>(pairs.size()),
                              .total_words = words,
                              .checksum = &device_result->checksum,
                              .bad_extent = &device_result->bad_extent},
                             stream);
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(&result, device_result, sizeof(result), cudaMemcpyDeviceToHost, stream);
  const cudaError_t freed = cudaFreeAsync(memory, stream);
  if (err == cudaSuccess) err = freed;
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  TANDEM_CUDA_RETURN(err, dst != nullptr ? "copying KV to the peer" : "checksumming KV");
  if (result.bad_extent != 0) {
    return absl::InvalidArgumentError("a KV range lies outside its pool or is not 8-byte aligned");
  }
  return static_cast<uint64_t>(result.checksum);
}

}  // namespace

class CudaV4PeerKv::Writer : public PeerKvWriter {
 public:
  Writer(CudaV4PeerKv* owner, std::shared_ptr<cuda_model::IpcMapping> mapping)
      : owner_(owner), mapping_(std::move(mapping)) {}

  absl::Status WriteLayer(int64_t, std::span<const int32_t>, int64_t, int64_t) override {
    return absl::UnimplementedError("DeepSeek-V4's KV moves as whole sequences (WriteRanges)");
  }
  bool writes_ranges() const override { return true; }
  absl::Status WriteRanges(std::span<const KvExtent> src, std::span<const KvExtent> dst) override {
    if (written_) return absl::FailedPreconditionError("a sequence's KV ranges go in one call");
    written_ = true;
    if (src.size() != dst.size()) {
      return absl::InvalidArgumentError(absl::StrCat(src.size(), " source KV ranges but ", dst.size(), " destinations"));
    }
    std::vector<cuda::KvExtentPair> pairs;
    pairs.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i].bytes != dst[i].bytes || src[i].layer != dst[i].layer) {
        return absl::InvalidArgumentError(absl::StrCat("KV range ", i, ": ", src[i].bytes, " bytes of layer ",
                                                       src[i].layer, " to ", dst[i].bytes, " bytes of layer ",
                                                       dst[i].layer));
      }
      pairs.push_back({.src_offset = src[i].offset, .dst_offset = dst[i].offset, .bytes = src[i].bytes,
                       .layer = src[i].layer});
    }
    // On the model's stream: after the pass that wrote these ranges, before any that
    // reuses them. The kernel bounds every range by the pools' real extents (the mapping's
    // as the driver reports it, not as the peer claimed).
    TANDEM_CUDA_RETURN(cudaSetDevice(owner_->device_), "selecting the GPU");
    ASSIGN_OR_RETURN(const uint64_t sum, CopyExtents(std::move(pairs), owner_->pool_,
                                                     static_cast<std::byte*>(mapping_->base()), mapping_->bytes(),
                                                     owner_->model_stream_));
    checksum_ = sum;
    bytes_ = static_cast<int64_t>(KvExtentsBytes(src));
    return absl::OkStatus();
  }
  int64_t bytes() const override { return bytes_; }
  uint64_t checksum() const override { return checksum_; }
  std::string path() const override {
    return mapping_->same_device() ? absl::StrCat("cuda-ipc (same GPU, cuda:", mapping_->device(), ")")
                                   : absl::StrCat("cuda-ipc (cuda:", mapping_->device(), " -> peer GPU)");
  }

 private:
  CudaV4PeerKv* owner_;
  std::shared_ptr<cuda_model::IpcMapping> mapping_;
  bool written_ = false;
  int64_t bytes_ = 0;
  uint64_t checksum_ = 0;
};

absl::StatusOr<std::unique_ptr<CudaV4PeerKv>> CudaV4PeerKv::Create(int device, std::span<std::byte> pool,
                                                                   void* model_stream) {
  if (pool.empty()) return absl::FailedPreconditionError("no GPU KV pool to share");
  std::unique_ptr<CudaV4PeerKv> p(new CudaV4PeerKv(device, pool, static_cast<cudaStream_t>(model_stream)));
  TANDEM_CUDA_RETURN(cudaSetDevice(device), "selecting the GPU");
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&p->side_stream_, cudaStreamNonBlocking), "creating a stream");
  return p;
}

CudaV4PeerKv::~CudaV4PeerKv() {
  if (side_stream_ != nullptr) {
    cudaStreamSynchronize(side_stream_);
    cudaStreamDestroy(side_stream_);
  }
}

absl::StatusOr<DeviceKvPool> CudaV4PeerKv::Share(int64_t num_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!shared_) {
    ASSIGN_OR_RETURN(cuda_model::IpcPoolDescriptor d, cuda_model::ExportIpcPool(pool_.data(), pool_.size(), device_));
    shared_ = DeviceKvPool{.host_id = d.host_id,
                           .device_uuid = d.device_uuid,
                           .ipc_handle = d.handle,
                           .bytes = d.bytes,
                           .num_blocks = num_blocks,
                           .bytes_per_value = 4,
                           .pid = d.pid};
  }
  return *shared_;
}

absl::StatusOr<std::unique_ptr<PeerKvWriter>> CudaV4PeerKv::Open(const DeviceKvPool& peer) {
  if (peer.bytes_per_value != 4) {
    return absl::FailedPreconditionError(absl::StrCat("peer KV pool holds ", peer.bytes_per_value,
                                                      "-byte values, this one float32"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "selecting the GPU");
  ASSIGN_OR_RETURN(std::shared_ptr<cuda_model::IpcMapping> mapping,
                   mappings_.Map({.host_id = peer.host_id, .device_uuid = peer.device_uuid, .handle = peer.ipc_handle,
                                  .bytes = peer.bytes, .pid = peer.pid},
                                 device_));
  return std::unique_ptr<PeerKvWriter>(new Writer(this, std::move(mapping)));
}

absl::StatusOr<uint64_t> CudaV4PeerKv::Checksum(std::span<const KvExtent> ranges) {
  std::vector<cuda::KvExtentPair> pairs;
  pairs.reserve(ranges.size());
  for (const KvExtent& r : ranges) {
    pairs.push_back({.src_offset = r.offset, .dst_offset = 0, .bytes = r.bytes, .layer = r.layer});
  }
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "selecting the GPU");
  return CopyExtents(std::move(pairs), pool_, nullptr, 0, side_stream_);
}

}  // namespace tandem::v4::cuda_v4
