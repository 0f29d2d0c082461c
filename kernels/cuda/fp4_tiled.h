// FP4 e2m1 weights (one scale per 32 along a row) rearranged for the tensor-core GEMV
// (quantized_gemv.h, QuantizedWeight::kFp4Tiled): each warp's 16-byte loads then hold
// exactly the A fragments of mma.m16n8k16 (16 weight rows x 16 of k), ready after the
// cheap FP4 -> f16x2 widening, and every 16 of k that one MMA sums share a scale.
//
// Layout, from a plain [rows][cols / 2] FP4 matrix (low nibble first) with [rows][cols / 32]
// scales; rows padded with zeros to whole tiles of 16, cols a multiple of 64:
//   codes  [tile][cols / 64][lane 0..31][16 bytes]: lane = 4 g + t holds four 32-bit words,
//          (chunk 0, row g), (chunk 0, row g + 8), (chunk 1, row g), (chunk 1, row g + 8)
//          of the tile, chunk c covering cols base = 64 cb + 32 c .. + 31; the word's
//          nibble i (i < 4) is col base + 8 i + 2 t and nibble i + 4 is the col after it
//          (so nibbles i and i + 4 are the low and high nibble of one plain byte);
//   scales [tile][cols / 64][g 0..7][4 floats]: rows g and g + 8 of chunk 0, then of chunk 1.
// The MMA's logical k positions 2t, 2t+1, 2t+8, 2t+9 of a 16-wide step are then cols base +
// 16 h + 2t + {0, 1, 8, 9} for the step's half h of the chunk: the activations are read in
// their natural order.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

inline constexpr int64_t Fp4TiledTiles(int64_t rows) { return (rows + 15) / 16; }
inline constexpr int64_t Fp4TiledCodeBytes(int64_t rows, int64_t cols) { return Fp4TiledTiles(rows) * (cols / 64) * 512; }
inline constexpr int64_t Fp4TiledScaleCount(int64_t rows, int64_t cols) { return Fp4TiledTiles(rows) * (cols / 64) * 32; }

// Host: rearranges a plain FP4 matrix (codes [rows][cols / 2], scales [rows][cols / 32])
// into the tiled layout (Fp4TiledCodeBytes / Fp4TiledScaleCount). cols % 64 == 0.
void TileFp4(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, uint8_t* tiled_codes,
             float* tiled_scales);

// Widens rows [0, rows) of a tiled matrix to float32 [rows][cols]: e2m1 value times its
// scale, rounded once (DequantizeFp4ToF32's values). `src` and `scales` point at the tile
// holding row 0 (a slab of whole tiles).
struct DequantizeFp4TiledParams {
  const uint8_t* src = nullptr;
  const float* scales = nullptr;
  float* dst = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // a multiple of 64
};

cudaError_t DequantizeFp4TiledToF32(const DequantizeFp4TiledParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
