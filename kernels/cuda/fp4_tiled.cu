#include "kernels/cuda/fp4_tiled.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"

namespace tandem::cuda {

void TileFp4(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, uint8_t* tiled_codes,
             float* tiled_scales) {
  const int64_t tiles = Fp4TiledTiles(rows), cbs = cols / 64;
  auto byte = [&](int64_t r, int64_t col) -> uint32_t {  // the plain byte of cols col, col + 1
    return r < rows ? codes[r * (cols / 2) + col / 2] : 0u;
  };
  auto scale = [&](int64_t r, int64_t chunk) { return r < rows ? scales[r * (cols / 32) + chunk] : 0.0f; };
  for (int64_t tile = 0; tile < tiles; ++tile) {
    for (int64_t cb = 0; cb < cbs; ++cb) {
      const int64_t item = tile * cbs + cb;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t words[4];
        for (int q = 0; q < 4; ++q) {
          const int64_t r = tile * 16 + g + 8 * (q % 2), base = 64 * cb + 32 * (q / 2);
          uint32_t w = 0;
          for (int i = 0; i < 4; ++i) {
            const uint32_t b = byte(r, base + 8 * i + 2 * t);
            w |= (b & 0xfu) << (4 * i);
            w |= (b >> 4) << (4 * (i + 4));
          }
          words[q] = w;
        }
        std::memcpy(tiled_codes + (item * 32 + lane) * 16, words, 16);
      }
      for (int g = 0; g < 8; ++g) {
        float* s = tiled_scales + (item * 8 + g) * 4;
        const int64_t r = tile * 16 + g;
        s[0] = scale(r, 2 * cb);
        s[1] = scale(r + 8, 2 * cb);
        s[2] = scale(r, 2 * cb + 1);
        s[3] = scale(r + 8, 2 * cb + 1);
      }
    }
  }
}

namespace {

constexpr int kThreads = 256;

// A thread per lane's 16 bytes: 32 values written to their rows and cols.
__global__ void DequantizeFp4TiledKernel(DequantizeFp4TiledParams p) {
  internal::WaitAndTrigger();
  constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const int64_t cbs = p.cols / 64, items = (p.rows + 15) / 16 * cbs * 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int lane = static_cast<int>(i % 32), g = lane / 4, t = lane % 4;
    const int64_t item = i / 32, tile = item / cbs, cb = item % cbs;
    const uint4 v = reinterpret_cast<const uint4*>(p.src)[i];
    const float4 s = reinterpret_cast<const float4*>(p.scales)[item * 8 + g];
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const float sc[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t r = tile * 16 + g + 8 * (q % 2), base = 64 * cb + 32 * (q / 2);
      if (r >= p.rows) continue;
      float* row = p.dst + r * p.cols;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const uint32_t code = (words[q] >> (4 * n)) & 0xfu;
        const float value = kValues[code & 7] * sc[q];
        row[base + 8 * (n % 4) + 2 * t + n / 4] = (code & 8) != 0 ? -value : value;
      }
    }
  }
}

}  // namespace

cudaError_t DequantizeFp4TiledToF32(const DequantizeFp4TiledParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.src == nullptr || p.scales == nullptr || p.dst == nullptr || p.rows < 0 || p.cols < 0 || p.cols % 64 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t items = Fp4TiledTiles(p.rows) * (p.cols / 64) * 32;
  const int64_t blocks = std::min<int64_t>((items + kThreads - 1) / kThreads, 65536);
  return internal::Launch(DequantizeFp4TiledKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                          p);
}

}  // namespace tandem::cuda
