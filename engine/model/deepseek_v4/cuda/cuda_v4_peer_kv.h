// DeepSeek-V4's device-to-device KV transfer (model_backend.h: ShareKvPool, OpenPeerKv,
// DeviceRangesChecksum): a decode replica's GPU pool, which has the host pool's layout,
// shared over CUDA IPC (cuda_ipc.h); a prefill replica copies a finished prompt's ranges
// of its own GPU pool (KvPool::SequenceExtents) into the same list of ranges of the
// peer's pool with kernels/cuda/kv_extent_copy.h, checksumming as it copies, and the
// decode replica checksums what arrived the same way before the sequence's first step.
// V2/V3's one latent stream moves layer by layer instead (engine/model/cuda/cuda_peer_kv.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "engine/model/cuda/ipc_mapping_cache.h"
#include "engine/model/kv_pool.h"
#include "engine/model/model_backend.h"

namespace tandem::v4::cuda_v4 {

class CudaV4PeerKv {
 public:
  // `pool` (a device allocation of `device`, the model's KV pool) and `model_stream` (the
  // stream whose passes write the pool) must outlive this object.
  static absl::StatusOr<std::unique_ptr<CudaV4PeerKv>> Create(int device, std::span<std::byte> pool,
                                                              void* model_stream);
  ~CudaV4PeerKv();

  // The pool as peers map it (`num_blocks` paged blocks per stream and layer).
  absl::StatusOr<DeviceKvPool> Share(int64_t num_blocks);
  // A writer into `peer`. FAILED_PRECONDITION when this process cannot map it (another
  // machine, a GPU it cannot reach) or its values are not float32.
  absl::StatusOr<std::unique_ptr<PeerKvWriter>> Open(const DeviceKvPool& peer);
  // The checksum of `ranges` of this pool (what a writer into it reported, if it arrived).
  absl::StatusOr<uint64_t> Checksum(std::span<const KvExtent> ranges);

 private:
  class Writer;
  CudaV4PeerKv(int device, std::span<std::byte> pool, cudaStream_t model_stream)
      : device_(device), pool_(pool), model_stream_(model_stream) {}

  const int device_;
  const std::span<std::byte> pool_;
  const cudaStream_t model_stream_;
  cudaStream_t side_stream_ = nullptr;  // Checksum's, off the model's stream

  std::mutex mu_;  // everything below
  cuda_model::IpcMappingCache mappings_;
  std::optional<DeviceKvPool> shared_;
};

}  // namespace tandem::v4::cuda_v4
