// The x86 vector variants of the bf16 row kernel (kernels/cpu/matmul_bf16.h), compiled
// with target attributes so that the library itself stays at the baseline ISA and
// Bf16RowsKernelFor picks one by cpuid.
//
// Decode at batch 1 reads each weight byte once, so what matters is keeping the memory
// system busy: several rows (independent streams and accumulator chains) per pass, the
// bf16 -> f32 widening as a zero-extension and a shift (exact), the multiply-adds in f32,
// and a software prefetch a few cache lines ahead in each row. Larger m reuses the block
// of rows from L1/L2 for every activation row.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/cpu/matmul_bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from `__m512 __Y = __Y;` (an undefined value they
// then overwrite), which -Wuninitialized reports once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TANDEM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))

namespace tandem::cpu {
namespace {

// How far ahead of the current column each row is prefetched.
constexpr int64_t kPrefetchBytes = 1024;

// The contract's step 3 and 4 for one output, after its 8-lane reduction `s`.
inline void Finish(const float* x, const std::byte* w, int64_t k8, int64_t k, float s, float* y, bool accumulate) {
  for (int64_t i = k8; i < k; ++i) {
    uint16_t v;
    std::memcpy(&v, w + 2 * i, 2);
    s = std::fma(x[i], Bf16ToF32(v), s);
  }
  *y = accumulate ? *y + s : s;
}

// Eight bf16 (unaligned) widened exactly to f32.
TANDEM_TARGET_AVX2 inline __m256 Widen8(const std::byte* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// R[j] = P[j] + P[j + 4].
TANDEM_TARGET_AVX2 inline __m128 Fold(__m256 a) {
  return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
}

// Step 2 of the contract for four accumulators at once: {s0, s1, s2, s3}.
TANDEM_TARGET_AVX2 inline __m128 Reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m128 h01 = _mm_hadd_ps(Fold(a0), Fold(a1));  // R0+R1, R2+R3 of rows 0 and 1
  const __m128 h23 = _mm_hadd_ps(Fold(a2), Fold(a3));
  return _mm_hadd_ps(h01, h23);
}

// kRows rows starting at w (row_bytes apart) against one activation row: their step-2 sums.
template <int kRows>
TANDEM_TARGET_AVX2 inline void DotRowsAvx2(const float* x, const std::byte* w, int64_t row_bytes, int64_t k8,
                                           bool prefetch, float* out) {
  __m256 acc[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  // 32 columns (one 64-byte line of each row) per iteration, four multiply-adds per
  // accumulator in sequence: the contract's order.
  for (; i + 32 <= k8; i += 32) {
    if (prefetch) {
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * row_bytes + 2 * i + kPrefetchBytes), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m256 xv = _mm256_loadu_ps(x + i + 8 * u);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        acc[r] = _mm256_fmadd_ps(Widen8(w + r * row_bytes + 2 * (i + 8 * u)), xv, acc[r]);
      }
    }
  }
  for (; i < k8; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_fmadd_ps(Widen8(w + r * row_bytes + 2 * i), xv, acc[r]);
  }
  if constexpr (kRows % 4 == 0) {
#pragma GCC unroll 2
    for (int r = 0; r < kRows; r += 4) _mm_storeu_ps(out + r, Reduce4(acc[r], acc[r + 1], acc[r + 2], acc[r + 3]));
  } else {
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < kRows; ++r) out[r] = _mm_cvtss_f32(Reduce4(acc[r], z, z, z));
  }
}

// Two rows per 512-bit register (row a in the low half, row b in the high half), so each
// lane's chain is the AVX2 variant's and the bits are the same.
TANDEM_TARGET_AVX512 inline __m512 Widen8x2(const std::byte* a, const std::byte* b) {
  const __m256i raw = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

template <int kRows>
TANDEM_TARGET_AVX512 inline void DotRowsAvx512(const float* x, const std::byte* w, int64_t row_bytes, int64_t k8,
                                               bool prefetch, float* out) {
  static_assert(kRows % 8 == 0);
  constexpr int kPairs = kRows / 2;
  __m512 acc[kPairs];
#pragma GCC unroll 8
  for (int q = 0; q < kPairs; ++q) acc[q] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k8; i += 32) {
    if (prefetch) {
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * row_bytes + 2 * i + kPrefetchBytes), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i + 8 * u));
      const std::byte* p = w + 2 * (i + 8 * u);
#pragma GCC unroll 8
      for (int q = 0; q < kPairs; ++q) {
        acc[q] = _mm512_fmadd_ps(Widen8x2(p + 2 * q * row_bytes, p + (2 * q + 1) * row_bytes), xv, acc[q]);
      }
    }
  }
  for (; i < k8; i += 8) {
    const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i));
    const std::byte* p = w + 2 * i;
#pragma GCC unroll 8
    for (int q = 0; q < kPairs; ++q) {
      acc[q] = _mm512_fmadd_ps(Widen8x2(p + 2 * q * row_bytes, p + (2 * q + 1) * row_bytes), xv, acc[q]);
    }
  }
#pragma GCC unroll 4
  for (int q = 0; q < kPairs; q += 2) {
    _mm_storeu_ps(out + 2 * q,
                  Reduce4(_mm512_castps512_ps256(acc[q]), _mm512_extractf32x8_ps(acc[q], 1),
                          _mm512_castps512_ps256(acc[q + 1]), _mm512_extractf32x8_ps(acc[q + 1], 1)));
  }
}

// Rows [row_begin, row_end) in blocks of kBlock (each activation row against the block,
// the block's bytes then in cache), the last few rows one at a time.
template <int kBlock, void (*kDotBlock)(const float*, const std::byte*, int64_t, int64_t, bool, float*),
          void (*kDotOne)(const float*, const std::byte*, int64_t, int64_t, bool, float*)>
inline void RowsLoop(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  const int64_t k = p.w->cols, k8 = k / 8 * 8, row_bytes = 2 * k;
  float out[kBlock];
  int64_t r = row_begin;
  for (; r < row_end; r += kBlock) {
    const int64_t n = std::min<int64_t>(kBlock, row_end - r);
    const std::byte* w = p.w->data + r * row_bytes;
    for (int64_t t = 0; t < p.m; ++t) {
      const float* x = p.x + t * p.x_stride;
      if (n == kBlock) {
        kDotBlock(x, w, row_bytes, k8, t == 0, out);
      } else {
        for (int64_t j = 0; j < n; ++j) kDotOne(x, w + j * row_bytes, row_bytes, k8, false, out + j);
      }
      float* y = p.y + t * p.y_stride + r;
      for (int64_t j = 0; j < n; ++j) Finish(x, w + j * row_bytes, k8, k, out[j], y + j, p.accumulate);
    }
  }
}

TANDEM_TARGET_AVX2 void DotBlockAvx2(const float* x, const std::byte* w, int64_t rb, int64_t k8, bool pf, float* out) {
  DotRowsAvx2<8>(x, w, rb, k8, pf, out);
}
TANDEM_TARGET_AVX2 void DotOneAvx2(const float* x, const std::byte* w, int64_t rb, int64_t k8, bool pf, float* out) {
  DotRowsAvx2<1>(x, w, rb, k8, pf, out);
}
TANDEM_TARGET_AVX512 void DotBlockAvx512(const float* x, const std::byte* w, int64_t rb, int64_t k8, bool pf,
                                         float* out) {
  DotRowsAvx512<8>(x, w, rb, k8, pf, out);
}

}  // namespace

void Bf16RowsAvx2(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  RowsLoop<8, DotBlockAvx2, DotOneAvx2>(p, row_begin, row_end);
}

void Bf16RowsAvx512(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  RowsLoop<8, DotBlockAvx512, DotOneAvx2>(p, row_begin, row_end);
}

}  // namespace tandem::cpu

#endif  // x86-64
