// Block-scaled FP8 e4m3 matrix products for prefill-sized linears, in DeepSeek-V3's FP8
// layout (the checkpoints' weights and block scales as stored, activations quantized per
// token and 128 columns as DeepSeek's inference code does):
//
//   Fp8QuantizeRows:  q[i][c] = e4m3(x[i][c] / s[c / 128][i]),
//                     s[b][i] = max(max_{c in block b} |x[i][c]|, 1e-4) / 448
//   Fp8Gemm:          y[i][j] (+)= sum_b a_scales[b][i] * b_scales[j / 128][b]
//                                        * sum_{c in block b} a[i][c] * b[j][c]
//
// Fp8Gemm runs on Hopper (sm_90a) only: a persistent kernel of one producer warpgroup, whose
// one thread moves tiles of a (128 rows) and b (128 or 256 rows) into shared memory with
// TMA, six or four stages deep, and two consumer warpgroups that multiply them on wgmma
// (m64n128k32, e4m3 in, float32 out), 128 x 128 or 128 x 256 outputs per tile. Each 128-wide k block's products are summed on the
// tensor cores alone and then scaled and added in float32 registers: the tensor cores'
// FP8 accumulation keeps fewer mantissa bits than float32 (DeepSeek-V3 report, 3.3.2), so a
// sum over a whole row of k would lose precision with k. Other devices: cudaErrorNotSupported.
//
// Grouped (a MoE layer's experts at prefill, `groups` > 0): `groups` products in one launch.
// a's rows are sorted by group, group g's being [group_offsets[g], group_offsets[g + 1])
// (a device array, written by an earlier kernel; m is a's capacity), b holds the groups'
// [n][ldb] matrices one after another, and y's rows are a's. The tiles of all groups share
// one persistent grid. With b_row_scales, b's scales are per row ([groups][n][ceil(k / 128)]:
// cuda_weights.h's expert row scales) and within each 128-row tile the rows of even 8-row
// octets share one scale and those of odd octets another, as a 128 x 128-block-scaled matrix
// expanded to rows does, or its gate and up rows interleaved by 8 (the expert gate_up).
//
// Requirements: a, b 16-byte aligned with row strides (bytes) multiples of 16; k a
// multiple of 16; a k tail shorter than 128 and m, n tails are zero-filled by TMA.
// y bf16 or float32 [m][ldy], ldy even, 8-byte aligned; accumulate (float32 only) adds to y.
// No allocation; graph-capturable (the TMA descriptors travel in the kernel's parameters).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct Fp8GemmParams {
  const uint8_t* a = nullptr;  // activations, e4m3 [m][lda]
  int64_t lda = 0;
  const float* a_scales = nullptr;  // [ceil(k / 128)][a_scales_stride], a_scales_stride >= m
  int64_t a_scales_stride = 0;
  const uint8_t* b = nullptr;  // weights, e4m3 [n][ldb]
  int64_t ldb = 0;
  const float* b_scales = nullptr;  // [groups][ceil(n / 128)][ceil(k / 128)] (weight_scale_inv); row scales: below
  void* y = nullptr;                // [m][ldy]
  int64_t ldy = 0;
  bool y_bf16 = true;
  bool accumulate = false;  // float32 y only: y += the product
  int m = 0;
  int n = 0;
  int k = 0;
  int groups = 0;  // 0: one product; else 1 .. kFp8GemmMaxGroups (above)
  const int32_t* group_offsets = nullptr;  // device [groups + 1], non-decreasing, last <= m
  bool b_row_scales = false;
  // Tiles of 128 x 256 outputs (four stages; the default: each byte loaded from L2 feeds
  // twice the products, 1.03-1.18x the 128 x 128 tiles' rate at DeepSeek's prefill shapes,
  // docs/performance.md) or 128 x 128 (six stages; tests and benchmarks compare the two).
  bool wide_tiles = true;
};

inline constexpr int kFp8GemmMaxGroups = 1024;

cudaError_t Fp8Gemm(const Fp8GemmParams& p, cudaStream_t stream);

// Whether Fp8Gemm runs on the current device.
bool Fp8GemmSupported();

struct Fp8QuantizeRowsParams {
  const void* x = nullptr;  // [m][ldx], bf16 or float32
  bool x_bf16 = true;
  int64_t ldx = 0;
  uint8_t* q = nullptr;  // e4m3 [m][ldq]; columns [k, ceil(k / 128) * 128) are not written
  int64_t ldq = 0;
  float* scales = nullptr;  // [ceil(k / 128)][scales_stride], scales_stride >= m
  int64_t scales_stride = 0;
  int m = 0;
  int k = 0;  // a multiple of 4
};

cudaError_t Fp8QuantizeRows(const Fp8QuantizeRowsParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
