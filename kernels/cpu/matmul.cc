#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/vec.h"

namespace tandem::cpu {

void DequantizeRows(const WeightMatrix& w, int64_t row_begin, int64_t num_rows, float* out) {
  const int64_t cols = w.cols;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t row = row_begin + r;
    float* dst = out + r * cols;
    switch (w.dtype) {
      case DType::kF32:
        std::memcpy(dst, w.data + row * cols * 4, cols * 4);
        break;
      case DType::kBF16: {
        const std::byte* src = w.data + row * cols * 2;
        for (int64_t c = 0; c < cols; ++c) {
          uint16_t v;
          std::memcpy(&v, src + 2 * c, 2);
          dst[c] = Bf16ToF32(v);
        }
        break;
      }
      case DType::kF16: {
        const std::byte* src = w.data + row * cols * 2;
        for (int64_t c = 0; c < cols; ++c) {
          uint16_t v;
          std::memcpy(&v, src + 2 * c, 2);
          dst[c] = F16ToF32(v);
        }
        break;
      }
      case DType::kF8E4M3: {
        const uint8_t* src = reinterpret_cast<const uint8_t*>(w.data) + row * cols;
        const float* table = F8E4M3Table();
        const float* scales = w.block_scales + (row / kFp8BlockSize) * w.scale_cols();
        for (int64_t c = 0; c < cols; ++c) dst[c] = table[src[c]] * scales[c / kFp8BlockSize];
        break;
      }
      case DType::kF8E8M0:
      case DType::kI8:
      case DType::kU8:
      case DType::kI32:
      case DType::kI64:
        TANDEM_CHECK(false) << "a " << DTypeName(w.dtype) << " tensor is not a weight matrix";
    }
  }
}

namespace {

constexpr int kRowsPerBlock = static_cast<int>(kMatmulRowBlock);

// Dot products of one activation row with kRowsPerBlock consecutive weight rows.
// Weight rows are float32 (contiguous, `wstride` floats apart).
inline void Dot4F32(const float* x, const float* w, int64_t wstride, int64_t k, float* out) {
  int64_t i = 0;
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#if TANDEM_CPU_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), xv, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + wstride + i), xv, a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * wstride + i), xv, a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * wstride + i), xv, a3);
  }
  s0 = HorizontalSum(a0);
  s1 = HorizontalSum(a1);
  s2 = HorizontalSum(a2);
  s3 = HorizontalSum(a3);
#endif
  for (; i < k; ++i) {
    s0 += x[i] * w[i];
    s1 += x[i] * w[wstride + i];
    s2 += x[i] * w[2 * wstride + i];
    s3 += x[i] * w[3 * wstride + i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// Same with bf16 weight rows read directly (`wstride` in elements).
inline void Dot4Bf16(const float* x, const std::byte* w, int64_t wstride, int64_t k, float* out) {
  int64_t i = 0;
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const int64_t rb = wstride * 2;  // bytes between rows
#if TANDEM_CPU_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const std::byte* p = w + 2 * i;
    a0 = _mm256_fmadd_ps(LoadBf16x8(p), xv, a0);
    a1 = _mm256_fmadd_ps(LoadBf16x8(p + rb), xv, a1);
    a2 = _mm256_fmadd_ps(LoadBf16x8(p + 2 * rb), xv, a2);
    a3 = _mm256_fmadd_ps(LoadBf16x8(p + 3 * rb), xv, a3);
  }
  s0 = HorizontalSum(a0);
  s1 = HorizontalSum(a1);
  s2 = HorizontalSum(a2);
  s3 = HorizontalSum(a3);
#endif
  for (; i < k; ++i) {
    uint16_t v[4];
    for (int r = 0; r < 4; ++r) std::memcpy(&v[r], w + r * rb + 2 * i, 2);
    s0 += x[i] * Bf16ToF32(v[0]);
    s1 += x[i] * Bf16ToF32(v[1]);
    s2 += x[i] * Bf16ToF32(v[2]);
    s3 += x[i] * Bf16ToF32(v[3]);
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

inline float Dot1Bf16(const float* x, const std::byte* w, int64_t k) {
  int64_t i = 0;
  float s = 0;
#if TANDEM_CPU_AVX2
  __m256 a = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) a = _mm256_fmadd_ps(LoadBf16x8(w + 2 * i), _mm256_loadu_ps(x + i), a);
  s = HorizontalSum(a);
#endif
  for (; i < k; ++i) {
    uint16_t v;
    std::memcpy(&v, w + 2 * i, 2);
    s += x[i] * Bf16ToF32(v);
  }
  return s;
}

inline void Store(float* y, float v, bool accumulate) {
  if (accumulate) *y += v; else *y = v;
}

void MatmulRows(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  const int64_t k = w.cols;
  const bool direct = w.dtype == DType::kBF16 || w.dtype == DType::kF32;
  std::vector<float> scratch;
  if (!direct) scratch.resize(static_cast<size_t>(kRowsPerBlock * k));
  float out[kRowsPerBlock];
  int64_t r = row_begin;
  for (; r + kRowsPerBlock <= row_end; r += kRowsPerBlock) {
    const float* wf = nullptr;
    if (w.dtype == DType::kF32) {
      wf = reinterpret_cast<const float*>(w.data) + r * k;
    } else if (!direct) {
      DequantizeRows(w, r, kRowsPerBlock, scratch.data());
      wf = scratch.data();
    }
    for (int64_t t = 0; t < p.m; ++t) {
      const float* x = p.x + t * p.x_stride;
      if (wf != nullptr) Dot4F32(x, wf, k, k, out);
      else Dot4Bf16(x, w.data + r * k * 2, k, k, out);
      float* y = p.y + t * p.y_stride + r;
      for (int j = 0; j < kRowsPerBlock; ++j) Store(y + j, out[j], p.accumulate);
    }
  }
  for (; r < row_end; ++r) {
    const float* wf = nullptr;
    if (w.dtype == DType::kF32) {
      wf = reinterpret_cast<const float*>(w.data) + r * k;
    } else if (!direct) {
      DequantizeRows(w, r, 1, scratch.data());
      wf = scratch.data();
    }
    for (int64_t t = 0; t < p.m; ++t) {
      const float* x = p.x + t * p.x_stride;
      const float v = wf != nullptr ? Dot(x, wf, k) : Dot1Bf16(x, w.data + r * k * 2, k);
      Store(p.y + t * p.y_stride + r, v, p.accumulate);
    }
  }
}

}  // namespace

void Matmul(const MatmulParams& p, ThreadPool& pool) {
  TANDEM_CHECK(p.w != nullptr && p.w->valid());
  TANDEM_CHECK_GE(p.x_stride, p.w->cols);
  TANDEM_CHECK_GE(p.y_stride, p.w->rows);
  if (p.m == 0) return;
  const int64_t rows = p.w->rows;
  // Chunks are whole multiples of the row block so every thread runs the fast path.
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  pool.ParallelFor(blocks, /*grain=*/8, [&](int64_t b0, int64_t b1) {
    MatmulRows(p, b0 * kRowsPerBlock, std::min(rows, b1 * kRowsPerBlock));
  });
}

}  // namespace tandem::cpu
