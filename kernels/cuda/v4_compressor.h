// DeepSeek-V4's compressor on the GPU, the two steps that turn projected rows into the
// KV pool's compressed entries.
//
// CompressorEmit: one entry per closed window, the arithmetic of the CPU engine's
// Compressor::Emit (engine/model/deepseek_v4/v4_attention.cc): per channel the slots'
// gates (plus the position bias, float add) pooled as v4::PoolWindow does, then
// cpu::RmsNorm with the compressor's weight (sum of squares in double), then the rotary
// embedding of the window's position on the trailing rope_dim channels (interleaved
// pairs, as v4::Rope::Apply, forward). Slots are named by pointer, so a CSA window's Ca
// half (the previous window's rows, kept in the pool or the state) and its Cb half (this
// pass's projections) are read where they lie.
//
// CopyRows: dst[r] = src[r] + bias[r] elementwise (or a plain copy): the compressor state's
// carried rows (a window's unfinished rows, the overlap's biased gates) written into the
// pool.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct CompressorSlot {
  const float* kv = nullptr;    // width floats
  const float* gate = nullptr;  // width floats
  const float* bias = nullptr;  // width floats, or null when the gate is already biased
};

struct CompressorEmitParams {
  const CompressorSlot* slots = nullptr;  // device, [windows][max_slots]; the first num_slots[w] used
  const int32_t* num_slots = nullptr;     // device, [windows], each in [1, max_slots]
  int max_slots = 0;                      // 1..1024
  int64_t windows = 0;
  int64_t width = 0;           // entry width, at most kMaxCompressorWidth
  const float* norm = nullptr;  // [width] RMSNorm weight
  float eps = 0.0f;
  const int32_t* positions = nullptr;  // [windows]: the rope position of each entry (window index * rate)
  const float* inv_freq = nullptr;     // [rope_dim / 2]; may be null when rope_dim is 0
  int rope_dim = 0;                    // even, at most min(width, 256)
  float attention_factor = 1.0f;
  // Device, [windows]: where each entry's width floats go. An entry's output may alias
  // nothing else (no slot, no other entry). A window whose num_slots is outside
  // [1, max_slots] gets NaNs (seen downstream rather than read out of bounds).
  float* const* out = nullptr;
};

inline constexpr int64_t kMaxCompressorWidth = 8192;

cudaError_t CompressorEmit(const CompressorEmitParams& p, cudaStream_t stream);

struct CopyRowsParams {
  const float* const* src = nullptr;   // device, [rows]: width floats each
  const float* const* bias = nullptr;  // device, [rows], or null; a null entry: a plain copy
  float* const* dst = nullptr;         // device, [rows]; a row with a null src or dst is skipped
  int64_t rows = 0;
  int64_t width = 0;
};

// dst[r][i] = src[r][i] + bias[r][i]. Destination rows must not overlap each other or any
// source or bias row (rows are copied concurrently).
cudaError_t CopyRows(const CopyRowsParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
