// FP8 (e4m3), FP4 (e2m1) and bf16 weights widened in registers, shared by the narrow GEMV
// kernels (quantized_gemv.cu, quantized_gemv_mma.cu, fp4_expert_gemv.cu,
// moe_expert_gemv.cu): to f16x2 pairs for tensor cores, or on to float32.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace tandem::cuda::internal {

__device__ __forceinline__ float2 Half2Bits(uint32_t bits) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(bits & 0xffffu);
  raw.y = static_cast<unsigned short>(bits >> 16);
  return __half22float2(__half2(raw));
}

// Nibbles i and i + 4 of w (FP4 e2m1, low nibble first) as an f16x2, each 2^-14 times its
// value: codes i and i + 4 of a word sit 16 bits apart, as the halves of an f16x2 do, so one
// shift puts both codes' exponent and mantissa bits (e1 e0 m) at an f16's bits 11..9
// (exponent 0..3, the e2m1 subnormal 0.5 becoming f16's subnormal 2^-15) and their signs at
// bit 12, which moves to bit 15. The 2^14 is multiplied back with the scale.
__device__ __forceinline__ uint32_t Fp4PairToHalf2(uint32_t w, int i) {
  const uint32_t t = i < 3 ? w << (9 - 4 * i) : w >> 3;
  return (t & 0x0e000e00u) | ((t & 0x10001000u) << 3);
}

// The 8 FP4 values of a word as float32 (2^-14 times their values), in column order.
__device__ __forceinline__ void WidenFp4Word(uint32_t word, float* w) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Half2Bits(Fp4PairToHalf2(word, i));
    w[i] = f.x;
    w[i + 4] = f.y;
  }
}

// The 32 FP4 values of a 16-byte load as float32 (2^-14 times their values).
__device__ __forceinline__ void WidenFp4(const uint4& wv, float* w) {
  WidenFp4Word(wv.x, w);
  WidenFp4Word(wv.y, w + 8);
  WidenFp4Word(wv.z, w + 16);
  WidenFp4Word(wv.w, w + 24);
}

// Bytes h * 2, h * 2 + 1 of w (e4m3) as an f16x2 (exact).
__device__ __forceinline__ uint32_t Fp8PairToHalf2(uint32_t w, int h) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> (16 * h)), __NV_E4M3);
  return static_cast<uint32_t>(raw.x) | (static_cast<uint32_t>(raw.y) << 16);
}

// The 4 FP8 codes of a word (low byte first) as float32 (exact).
__device__ __forceinline__ void WidenFp8Word(uint32_t word, float* w) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float2 f = Half2Bits(Fp8PairToHalf2(word, h));
    w[2 * h] = f.x;
    w[2 * h + 1] = f.y;
  }
}

// 8 bf16 values of one 16-byte load: a bf16 is a float32's upper half.
__device__ __forceinline__ void WidenBf16(const uint4& wv, float* w) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[2 * q] = __uint_as_float(words[q] << 16);
    w[2 * q + 1] = __uint_as_float(words[q] & 0xffff0000u);
  }
}

}  // namespace tandem::cuda::internal
