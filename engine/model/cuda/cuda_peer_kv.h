// The CUDA backend's device-to-device KV transfer (model_backend.h: ShareKvPool,
// OpenPeerKv, DeviceKvChecksum): a decode replica's KV pool shared over CUDA IPC
// (cuda_ipc.h), and writers that copy a prefill's KV into it with kernels/cuda/
// kv_block_copy.h on the prefill model's stream, layer by layer, checksumming as they go.
//
// Each writer holds a slot: device block tables and a device checksum word, with a pinned
// host mirror the stream updates after every layer (so the checksum is readable on the
// host once the Forward that wrote has returned, without another synchronization).
// Mappings of peer pools are cached (ipc_mapping_cache.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cuda/cuda_deepseek_model.h"
#include "engine/model/cuda/cuda_ipc.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/model/cuda/ipc_mapping_cache.h"
#include "engine/model/model_backend.h"

namespace tandem::cuda_model {

class CudaPeerKv {
 public:
  // `pool` and `model_stream` (the model's cudaStream_t) must outlive this object;
  // `max_writers` writers may be open at once.
  static absl::StatusOr<std::unique_ptr<CudaPeerKv>> Create(const CudaDeepseekModel::KvPool& pool,
                                                            void* model_stream, int64_t max_writers);
  ~CudaPeerKv();

  absl::StatusOr<DeviceKvPool> Share();
  absl::StatusOr<std::unique_ptr<PeerKvWriter>> Open(const DeviceKvPool& peer, std::vector<int32_t> dst_blocks);
  absl::StatusOr<uint64_t> Checksum(std::span<const int32_t> blocks, int64_t num_tokens);

 private:
  class Writer;
  CudaPeerKv(const CudaDeepseekModel::KvPool& pool, cudaStream_t model_stream)
      : pool_(pool), model_stream_(model_stream) {}
  void ReleaseSlot(int slot);
  // INVALID_ARGUMENT unless `num_blocks` blocks of every layer fit in `bytes`.
  absl::Status CheckPeerGeometry(int64_t num_blocks, uint64_t bytes) const;

  // Slot s: device tables at tables_ + s * 2 * max_blocks (source, then destination),
  // checksum at sums_ + s; pinned source-table staging and checksum mirror likewise.
  int32_t* DeviceTable(int slot, int side) const {
    return tables_.get<int32_t>() + (static_cast<int64_t>(slot) * 2 + side) * pool_.max_blocks_per_seq;
  }

  const CudaDeepseekModel::KvPool pool_;
  const cudaStream_t model_stream_;
  cudaStream_t side_stream_ = nullptr;  // slot setup and verification, off the model's stream
  DeviceBuffer tables_, sums_;
  PinnedBuffer host_tables_, host_sums_;
  DeviceBuffer verify_table_, verify_sum_;
  PinnedBuffer verify_host_;

  std::mutex mu_;  // everything below; Checksum's buffers
  std::vector<int> free_slots_;
  IpcMappingCache mappings_;
  std::optional<DeviceKvPool> shared_;
};

}  // namespace tandem::cuda_model
