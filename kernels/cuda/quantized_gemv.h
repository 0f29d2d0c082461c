// Matrix-vector products of a few rows against weights stored narrow, dequantized in
// registers (decode steps are memory-bound on the weights: one byte, or half a byte, per
// weight read instead of two):
//   y[r][i] = sum_c x[r][c] * W[i][c]      for r < m (1..8), i < n
// with W one of DeepSeek's stored forms:
//   - kFp8Block128: FP8 e4m3 ("fn": no infinities) [n][k] with one float scale per 128 x
//     128 block, W = fp8 * scales[i / 128][c / 128] (V3/R1 and V4's attention weights);
//     on tensor cores where k is a multiple of 64 and there are 2 to 8 rows;
//   - kFp4Group32: FP4 e2m1 two a byte, low nibble first ([n][k / 2] bytes), with one float
//     scale per 32 along the input, W = e2m1 * scales[i][c / 32] (V4's routed experts;
//     ue8m0 scales as their float values). Hopper has no FP4 tensor cores: the codes are
//     widened in registers;
//   - kFp4Tiled: the same FP4 values and scales rearranged into 16-row tiles
//     (fp4_tiled.h), multiplied on tensor cores (quantized_gemv_mma.cu); k a multiple
//     of 64, w and scales 16-byte aligned;
//   - kBf16: bf16 [n][k], no scales (the checkpoints' other matrices: the LM head, the
//     routers, the compressors; read at two bytes a weight instead of float32's four).
// x and y float32. The sum groups the products of each 16 (FP8) or 32 (FP4) weights and
// multiplies their scale in once (bf16: the plain float32 sum of exact products), where the CPU engine multiplies each weight by its scale
// first: the same real sum, rounded differently (agreement to float32's relative 1e-6 of
// the terms' magnitudes, not bitwise).
//
// Persistent: as many blocks as stay resident, each staging x once in shared memory (m * k
// floats, at most kQuantizedGemvMaxSharedBytes) and then streaming weight rows, one warp per
// row, each lane's 16-byte loads pipelined two stages deep across the warp's rows. k a
// multiple of 16 (FP8), 32 (FP4) or 8 (bf16), weight rows (every expert's, in the routed form)
// 16-byte aligned. No allocation;
// graph-capturable; programmatic dependent launch (the first weights load before the wait).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

enum class QuantizedWeight : int { kFp8Block128 = 0, kFp4Group32 = 1, kBf16 = 2, kFp4Tiled = 3 };

inline constexpr int kQuantizedGemvMaxRows = 8;
inline constexpr int64_t kQuantizedGemvMaxSharedBytes = 200 * 1024;

// The shared memory a product of m rows of width k may stage (x as float4s, each row padded
// to a multiple of 8 of them, or as split f16 pairs and 32 bytes): the call is refused
// above kQuantizedGemvMaxSharedBytes.
inline constexpr int64_t QuantizedGemvSharedBytes(int64_t m, int64_t k) {
  return m * ((((k / 4) + 7) & ~int64_t{7}) * 16 + 32);
}

// One expert's matrix of the routed form (below): codes and scales as in the params.
struct QuantizedMatrixRef {
  const uint8_t* w = nullptr;
  const float* scales = nullptr;
};

struct QuantizedGemvParams {
  QuantizedWeight format = QuantizedWeight::kFp8Block128;
  const uint8_t* w = nullptr;    // FP8: [n][k]; FP4: [n][k / 2]; bf16: [n][k] of 2 bytes; tiled: fp4_tiled.h
  const float* scales = nullptr;  // FP8: [ceil(n / 128)][ceil(k / 128)]; FP4: [n][k / 32]; bf16: unused
  const float* x = nullptr;      // [m][ldx]
  int64_t ldx = 0;
  float* y = nullptr;  // [m][ldy]
  int64_t ldy = 0;
  int m = 1;  // 1 .. kQuantizedGemvMaxRows
  int64_t n = 0;
  int64_t k = 0;
  // The routed form (a MoE layer's experts, chosen on the device, no host round trip):
  // when `experts` is set, w and scales are unused and the kernel runs `problems`
  // products with m = 1, problem p multiplying x row p / x_group by the matrix of expert
  // ids[p] into y row p. An id outside [0, num_experts) gives a row of zeros (with
  // accumulate: adds nothing). Every expert's matrix is [n][k] of `format`.
  const QuantizedMatrixRef* experts = nullptr;  // device, [num_experts]
  int num_experts = 0;
  const int32_t* ids = nullptr;  // device, [problems]: written by an earlier kernel
  int problems = 1;              // 1 .. 65535
  int x_group = 1;               // e.g. top-k, when the problems of one token share its row
  // y += the products instead of y = (a residual stream); each element is written by one
  // thread, so no atomics.
  bool accumulate = false;
  // FP8 with k a multiple of 64 runs on tensor cores (quantized_gemv_mma.cu) unless this is
  // set (benchmarks and tests compare the two).
  bool scalar = false;
  // The routed FP4 form on expert tiles (fp4_expert_gemv.h) where it applies; false: a grid
  // column per problem (benchmarks and tests compare the two).
  bool expert_tiles = true;
};

cudaError_t QuantizedGemv(const QuantizedGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
