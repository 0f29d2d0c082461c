// Rotary position embedding (YaRN-ready) on the GPU, in place on float32 heads: for row r
// and head h, the rope_dim values at x + r * row_stride + h * head_stride are rotated by
// the angles positions[r] * inv_freq[i], with cos/sin scaled by attention_factor (YaRN's
// magnitude correction; 1 without YaRN). Interleaved pairs (x[2i], x[2i+1]) (DeepSeek's
// layout) or rotate_half pairs (x[i], x[i + rope_dim/2]). Matches kernels/cpu's
// RopeCosSin + ApplyRope exactly in float: the q heads and the shared rotary key of MLA
// both go through it (num_heads 1 for the key).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct RopeParams {
  float* x = nullptr;  // the first head's rotary part of row 0
  int64_t rows = 0;
  int num_heads = 1;
  int64_t row_stride = 0;   // floats between rows
  int64_t head_stride = 0;  // floats between heads of a row
  int rope_dim = 0;         // even, at most 256
  const int32_t* positions = nullptr;  // [rows]
  const float* inv_freq = nullptr;     // [rope_dim / 2]
  float attention_factor = 1.0f;
  bool interleaved = true;
  // Rotates back (by -position: cos and -sin), as DeepSeek-V4 undoes the rope on each
  // attention output head.
  bool inverse = false;
};

cudaError_t Rope(const RopeParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
