// Element type conversions on the GPU, 2-D with row strides: float32 <-> bf16 (round to
// nearest even, as kernels/common/dtype.h's F32ToBf16), and FP8 E4M3 weights with
// 128x128 block scales to bf16 or float32 (value = fp8 * scale[row / 128][col / 128],
// rounded once).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

struct ConvertParams {
  const void* src = nullptr;
  int64_t src_stride = 0;  // elements
  void* dst = nullptr;
  int64_t dst_stride = 0;  // elements
  int64_t rows = 0;
  int64_t cols = 0;
  // ConvertF32ToBf16 only, optional: the remainder v - bf16(v) in bf16, same layout as dst
  // (split activations, grouped_gemm.h).
  void* dst_lo = nullptr;
};

// src float, dst __nv_bfloat16.
cudaError_t ConvertF32ToBf16(const ConvertParams& p, cudaStream_t stream);
// src __nv_bfloat16, dst float.
cudaError_t ConvertBf16ToF32(const ConvertParams& p, cudaStream_t stream);

// Zeroes rows x row_bytes bytes at dst, rows pitch_bytes apart (what cudaMemset2DAsync
// does, as a kernel: a programmatic dependent launch can follow it, launch_control.h).
// row_bytes and pitch_bytes multiples of 4, at most 65535 rows.
struct ZeroRowsParams {
  void* dst = nullptr;
  int64_t pitch_bytes = 0;
  int64_t row_bytes = 0;
  int64_t rows = 0;
};

cudaError_t ZeroRows(const ZeroRowsParams& p, cudaStream_t stream);

struct DequantizeFp8Params {
  const uint8_t* src = nullptr;  // [rows][cols] E4M3 ("fn": no infinities)
  const float* scales = nullptr;  // [ceil(rows / 128)][ceil(cols / 128)]
  __nv_bfloat16* dst = nullptr;   // [rows][cols]
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t DequantizeFp8ToBf16(const DequantizeFp8Params& p, cudaStream_t stream);

// The same widened to float32 (fp8 value times its scale, rounded once: the CPU's
// cpu::DequantizeRows exactly).
struct DequantizeFp8ToF32Params {
  const uint8_t* src = nullptr;  // [rows][cols] E4M3
  const float* scales = nullptr;  // [ceil(rows / 128)][ceil(cols / 128)]
  float* dst = nullptr;           // [rows][cols]
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t DequantizeFp8ToF32(const DequantizeFp8ToF32Params& p, cudaStream_t stream);

// float32 weights quantized to FP8 E4M3 with 128x128 block scales, as `tandem make-model
// --dtype fp8` writes them (engine/model/model_generator.cc): per block, scale = amax / 448
// (1 for an all-zero block), code = e4m3(value / scale) rounded to nearest even and
// saturated to +-448. For weights generated on the GPU in the form an FP8 checkpoint has.
struct QuantizeFp8Params {
  const float* src = nullptr;  // [rows][cols]
  uint8_t* codes = nullptr;    // [rows][cols]
  float* scales = nullptr;     // [ceil(rows / 128)][ceil(cols / 128)]
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t QuantizeFp8Block(const QuantizeFp8Params& p, cudaStream_t stream);

// 128 x 128 block scales expanded to one row of scales per weight row (what
// MoeExpertGemvParams::b_row_scales holds): dst[g][r][c] = src[g][o(r) / 128][c] over
// `groups` matrices of `rows` rows, with o(r) = r, or, for a gate/up matrix whose rows are
// interleaved in blocks of 8 (8 gate rows, then their 8 up rows) and whose scales are the
// gate's then the up's (rows / 2 a multiple of 128), the row's place in [gate rows | up rows].
struct ExpandRowScalesParams {
  const float* src = nullptr;  // [groups][ceil(rows / 128)][cols]
  float* dst = nullptr;        // [groups][rows][cols]
  int64_t groups = 0;
  int64_t rows = 0;
  int64_t cols = 0;  // scale columns: ceil(k / 128)
  bool gate_up_interleaved = false;
};

cudaError_t ExpandRowScales(const ExpandRowScalesParams& p, cudaStream_t stream);

// FP4 e2m1 (two codes a byte, low nibble first) with one float scale per 32 along a row,
// widened to float32: e2m1 value times its scale, rounded once (exact for DeepSeek's
// power-of-two ue8m0 scales). cols a multiple of 32.
struct DequantizeFp4ToF32Params {
  const uint8_t* src = nullptr;   // [rows][cols / 2]
  const float* scales = nullptr;  // [rows][cols / 32]
  float* dst = nullptr;           // [rows][cols]
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t DequantizeFp4ToF32(const DequantizeFp4ToF32Params& p, cudaStream_t stream);

}  // namespace tandem::cuda
