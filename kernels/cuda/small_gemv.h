// Matrix-vector products for decode steps of a few tokens (memory-bound on the weights):
//
//   out[r][n] (+)= sum_k xn[r][k] * W[n][k]     for r < rows <= kSmallGemvMaxRows
//
// with float32 activations x (optionally RMSNorm'd on the fly: xn = norm_weight * x /
// sqrt(mean(x^2) + eps), as RmsNorm computes it; rows optionally gathered through x_rows)
// and bf16 weights W [n][k] (torch Linear layout), float32 products and accumulation: the
// activations are never rounded (the grouped GEMM's split activations approximate this).
// Each warp computes two output columns with 16-byte weight loads, all of a row's loads
// in flight at once; with programmatic dependent launch (launch_control.h) each block
// loads its first column block's first 2048 weights of each row (and its norm weights)
// into registers and the rest of those rows into L2 before waiting for the previous
// kernel, so the weight stream overlaps that kernel's tail. One launch replaces an RMSNorm, a GEMM and
// (with split-K) an output clear. Needs k a multiple of 8 and 16-byte aligned weight rows.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

inline constexpr int kSmallGemvMaxRows = 4;

struct SmallGemvParams {
  const float* x = nullptr;  // [*][ldx]
  int64_t ldx = 0;
  const int32_t* x_rows = nullptr;  // optional [rows]: the x row of each output row
  const float* norm_weight = nullptr;  // optional [k]: RMSNorm each x row first
  float norm_eps = 1e-6f;
  const __nv_bfloat16* w = nullptr;  // [n][k]
  int n = 0;
  int k = 0;
  int rows = 0;  // 1 .. kSmallGemvMaxRows
  float* out = nullptr;  // [rows][ldo]
  int64_t ldo = 0;
  bool accumulate = false;  // out += instead of out =
  // Optional: each row's arg-max over its n outputs too (the greedy token after the LM
  // head, without a launch of its own): NaN skipped, ties to the lower column, 0 when every
  // output is NaN. Each block reduces its columns into argmax_scratch and the last block to
  // finish (counter: zero before the first launch, left at zero) reduces the blocks'.
  int32_t* argmax = nullptr;         // [rows]
  void* argmax_scratch = nullptr;    // SmallGemvArgmaxScratchBytes() bytes
  uint32_t* argmax_counter = nullptr;
};

// Bytes of SmallGemvParams::argmax_scratch for launches on the current device.
size_t SmallGemvArgmaxScratchBytes();

cudaError_t SmallGemv(const SmallGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
