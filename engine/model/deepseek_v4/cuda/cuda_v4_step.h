// Internal to the DeepSeek-V4 GPU model's sources (cuda_v4_model.cc, cuda_v4_stage.cc,
// cuda_v4_moe.cc): a pass's device arrays and activations (CudaV4Model::Step), the staging
// of host arrays into one upload, and the helpers the three files share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_plan.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/v4_compressor.h"

namespace tandem::v4::cuda_v4 {
namespace step_detail {

using cuda_model::DeviceBuffer;
using cuda_model::PinnedBuffer;

// Host arrays laid out in one pinned buffer and copied to the device in one transfer;
// Add returns where an array will be on the device.
class Staging {
 public:
  template <typename T>
  const T* Add(const std::vector<T>& v) {
    offset_ = (offset_ + 255) & ~size_t{255};
    const size_t at = offset_;
    offset_ += v.size() * sizeof(T);
    pending_.push_back({at, v.data(), v.size() * sizeof(T)});
    layout_.push_back(static_cast<int64_t>(v.size() * sizeof(T)));
    return reinterpret_cast<const T*>(at);  // an offset until Upload rebases it
  }
  // Copies everything added to the device (growing the buffers) and returns the base that
  // the offsets Add returned are relative to.
  absl::StatusOr<const std::byte*> Upload(cudaStream_t stream) {
    const size_t need = std::max<size_t>(offset_, 256);
    if (host_.bytes() < need) {
      RETURN_IF_ERROR(host_.Allocate(need * 2, "a forward pass's plan"));
      RETURN_IF_ERROR(device_.Allocate(need * 2, "a forward pass's plan"));
    }
    for (const Pending& p : pending_) std::memcpy(host_.get<std::byte>() + p.at, p.data, p.bytes);
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(device_.get(), host_.get(), offset_, cudaMemcpyHostToDevice, stream),
                       "uploading a forward pass's plan");
    pending_.clear();
    offset_ = 0;
    uploaded_layout_.swap(layout_);
    layout_.clear();
    return device_.get<const std::byte>();
  }
  // The sizes of the arrays of the last upload, in order: with the base, where each was.
  const std::vector<int64_t>& uploaded_layout() const { return uploaded_layout_; }

 private:
  struct Pending {
    size_t at;
    const void* data;
    size_t bytes;
  };
  std::vector<Pending> pending_;
  std::vector<int64_t> layout_, uploaded_layout_;
  size_t offset_ = 0;
  PinnedBuffer host_;
  DeviceBuffer device_;
};

template <typename T>
T Rebase(T offset, const std::byte* base) {
  return reinterpret_cast<T>(const_cast<std::byte*>(base) + reinterpret_cast<uintptr_t>(offset));
}

inline absl::Status Kernel(cudaError_t err, const char* what) { return cuda_model::CudaStatus(err, what); }

// The widening scratch holds at most this many floats (256 MiB): larger matrices (the LM
// head) are widened and multiplied a slab of rows at a time.
inline constexpr int64_t kMaxWidenedElements = int64_t{64} << 20;

// Up to this many (token, slot) pairs a pass, narrow experts run as the routed GEMV with
// the routing left on the device; larger passes read it back for per-expert GEMMs.
inline constexpr int64_t kDeviceRoutedProblems = 64;

// Counts of compressed entries are rounded up to a power of two (at least 256) where they
// size launches and scratch (the attention's key lists, the indexer's scores), so that a
// decode step's launch layout, and with it its captured graph, changes only when a
// sequence's entries cross a bucket.
inline int64_t EntryBucket(int64_t n) {
  int64_t b = 256;
  while (b < n) b *= 2;
  return b;
}

// The most passes' graphs kept; beyond it the cache starts over.
inline constexpr size_t kMaxGraphs = 64;


inline absl::Status RunCopies(const float* const* src, const float* const* bias,
                       float* const* dst, int64_t rows, int64_t width, cudaStream_t stream, const char* what) {
  if (rows == 0) return absl::OkStatus();
  return Kernel(cuda::CopyRows({.src = src, .bias = bias, .dst = dst, .rows = rows, .width = width}, stream), what);
}

}  // namespace step_detail

// A pass's device arrays: the plan's (rebased staging offsets) and the activations.
struct CudaV4Model::Step {
  const StepPlan* plan = nullptr;
  int64_t rows = 0;
  // Plan arrays on the device.
  const int32_t *tokens = nullptr, *positions = nullptr, *token_seq = nullptr;
  const int32_t *seq_start = nullptr, *seq_row0 = nullptr, *seq_entries_csa = nullptr, *seq_entries_hca = nullptr;
  const int64_t *seq_entry_begin_csa = nullptr, *seq_entry_begin_hca = nullptr, *entry_rows_csa = nullptr,
                *entry_rows_hca = nullptr;
  struct Compressor {
    const cuda::CompressorSlot* slots = nullptr;
    const int32_t* num_slots = nullptr;
    const int32_t* positions = nullptr;
    float* const* out = nullptr;
  };
  struct Copies {
    const float* const* src = nullptr;
    const float* const* bias = nullptr;
    float* const* dst = nullptr;
    int64_t rows = 0;
  };
  struct Layer {
    Compressor main, indexer;
    Copies main_overlap, main_partial, indexer_overlap, indexer_partial, ring;
    const float* const* seq_ring = nullptr;
  };
  std::vector<Layer> layers;
  const float* const* embed_src = nullptr;
  float* const* embed_dst = nullptr;
  const float* const* logits_src = nullptr;
  float* const* logits_dst = nullptr;
  int64_t logits_rows = 0;
  int max_keys = 0;
  int64_t max_entries_csa = 0;  // bucketed (EntryBucket): the scores' row stride
  const std::byte* staged_base = nullptr;
  std::vector<int64_t> entry_rows_csa_padded, entry_rows_hca_padded;  // staged: capacity-bucketed

  // Activations ([rows][...] unless said).
  float *streams = nullptr, *flat = nullptr, *mix = nullptr, *pre = nullptr, *post = nullptr, *comb = nullptr;
  float *u = nullptr, *sub = nullptr, *xp = nullptr, *cq = nullptr, *kv = nullptr, *q = nullptr, *o = nullptr;
  float *grouped = nullptr, *index_q = nullptr, *index_w = nullptr, *scores = nullptr;
  bool shared_beside = false;  // this layer's shared expert runs on the side stream
  float* attention_partials = nullptr;  // the sink attention's split key lists
  int64_t attention_partial_floats = 0;
  const float** keys = nullptr;
  int32_t* num_keys = nullptr;
  int32_t* bad = nullptr;  // [2]: key lists, attention
  float *router = nullptr, *route_w = nullptr, *gathered = nullptr, *hidden = nullptr, *act = nullptr,
        *expert_out = nullptr, *shared_hidden = nullptr, *shared_act = nullptr;
  int32_t* route_ids = nullptr;
  float* logits = nullptr;  // [logits rows][vocab]

  cuda_model::DeviceBuffer activations;
  size_t activation_bytes = 0;
  step_detail::Staging staging, moe_staging;
  cuda_model::PinnedBuffer host_ids, host_bad;
  // The MoE layer's host lists (kept alive until uploaded).
  std::vector<const float*> moe_src, moe_rows;
  // The device-routed MoE's output rows (expert_out's, one per token and slot), per pass.
  std::vector<const float*> routed_rows_host;
  const float* const* routed_rows = nullptr;
  std::vector<float*> moe_dst;
};

}  // namespace tandem::v4::cuda_v4
