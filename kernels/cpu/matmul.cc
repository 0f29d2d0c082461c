#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/fp8_gemm_input.h"
#include "kernels/cpu/matmul_bf16.h"
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
// The bf16 kernels' register block (kernels/cpu/matmul_bf16_x86.cc).
constexpr int kBf16RowsPerBlock = 8;

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

inline void Store(float* y, float v, bool accumulate) {
  if (accumulate) *y += v; else *y = v;
}

// F32 weights read directly; F16 and FP8 dequantized kRowsPerBlock rows at a time.
void MatmulRows(const MatmulParams& p, int64_t row_begin, int64_t row_end) {
  const WeightMatrix& w = *p.w;
  const int64_t k = w.cols;
  const bool direct = w.dtype == DType::kF32;
  std::vector<float> scratch;
  if (!direct) scratch.resize(static_cast<size_t>(kRowsPerBlock * k));
  float out[kRowsPerBlock];
  int64_t r = row_begin;
  for (; r + kRowsPerBlock <= row_end; r += kRowsPerBlock) {
    const float* wf = reinterpret_cast<const float*>(w.data) + r * k;
    if (!direct) {
      DequantizeRows(w, r, kRowsPerBlock, scratch.data());
      wf = scratch.data();
    }
    for (int64_t t = 0; t < p.m; ++t) {
      Dot4F32(p.x + t * p.x_stride, wf, k, k, out);
      float* y = p.y + t * p.y_stride + r;
      for (int j = 0; j < kRowsPerBlock; ++j) Store(y + j, out[j], p.accumulate);
    }
  }
  for (; r < row_end; ++r) {
    const float* wf = reinterpret_cast<const float*>(w.data) + r * k;
    if (!direct) {
      DequantizeRows(w, r, 1, scratch.data());
      wf = scratch.data();
    }
    for (int64_t t = 0; t < p.m; ++t) Store(p.y + t * p.y_stride + r, Dot(p.x + t * p.x_stride, wf, k), p.accumulate);
  }
}

}  // namespace

Bf16RowsKernel Bf16RowsKernelFor(CpuIsa isa) {
  TANDEM_CHECK(CpuIsaSupported(isa)) << CpuIsaName(isa) << " is not supported here";
  switch (isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case CpuIsa::kAvx512:
      return Bf16RowsAvx512;
    case CpuIsa::kAvx2:
      return Bf16RowsAvx2;
#endif
    default:
      return Bf16RowsGeneric;
  }
}



namespace {

void CheckParams(const MatmulParams& p) {
  TANDEM_CHECK(p.w != nullptr && p.w->valid());
  TANDEM_CHECK_GE(p.x_stride, p.w->cols);
  TANDEM_CHECK_GE(p.y_stride, p.w->rows);
}

// Rows per unit of parallel work: whole multiples of the kernels' row blocks, so every
// thread runs the fast path; which thread computes a row changes none of its bits.
int64_t RowsPerBlock(const MatmulParams& p) { return p.w->dtype == DType::kBF16 ? kBf16RowsPerBlock : kRowsPerBlock; }

int64_t Blocks(const MatmulParams& p) {
  const int64_t block = RowsPerBlock(p);
  return p.m == 0 ? 0 : (p.w->rows + block - 1) / block;
}

// Blocks [b0, b1) of one matmul.
void RunBlocks(const MatmulParams& p, Bf16RowsKernel bf16, int64_t b0, int64_t b1) {
  const int64_t block = RowsPerBlock(p);
  const int64_t r0 = b0 * block, r1 = std::min(p.w->rows, b1 * block);
  if (p.w->dtype == DType::kBF16) bf16(p, r0, r1);
  else MatmulRows(p, r0, r1);
}

// About 32 rows of 1-4 KB: a few tens of KB per chunk at the least.
constexpr int64_t kGrainRows = 32;

}  // namespace

namespace {

// Decode rows of at most this many bytes run the portable kernel by default: one row at a
// time is one sequential stream for the hardware prefetcher, where the vector kernels'
// eight interleaved short rows leave it behind (cpu_matmul_bench, docs/performance.md).
// The same bits either way (matmul_bf16.h's contract); TANDEM_CPU_ISA still forces one.
constexpr int64_t kShortRowBytes = 2048;

Bf16RowsKernel DefaultKernel(const MatmulParams& p) {
  if (!CpuIsaFromEnvironment() && p.m == 1 && p.w->cols * 2 <= kShortRowBytes) return Bf16RowsGeneric;
  return Bf16RowsKernelFor(ActiveCpuIsa());
}

void RunMatmul(const MatmulParams& p, ThreadPool& pool, Bf16RowsKernel kernel) {
  if (p.m == 0) return;
  pool.ParallelFor(Blocks(p), kGrainRows / RowsPerBlock(p), [&](int64_t b0, int64_t b1) { RunBlocks(p, kernel, b0, b1); });
}

}  // namespace

namespace {

// p itself, or (round_fp8_input on an FP8 matrix) p reading x rounded into `rounded`.
MatmulParams WithRoundedInput(const MatmulParams& p, std::vector<float>& rounded) {
  if (!p.round_fp8_input || p.w->dtype != DType::kF8E4M3 || p.m == 0) return p;
  rounded.resize(static_cast<size_t>(p.m * p.w->cols));
  RoundAsFp8GemmInput(p.x, p.m, p.x_stride, p.w->cols, /*bf16_first=*/false, rounded.data());
  MatmulParams q = p;
  q.x = rounded.data();
  q.x_stride = p.w->cols;
  return q;
}

}  // namespace

void Matmul(const MatmulParams& p, ThreadPool& pool) {
  CheckParams(p);
  std::vector<float> rounded;
  const MatmulParams q = WithRoundedInput(p, rounded);
  RunMatmul(q, pool, DefaultKernel(q));
}

void Matmul(const MatmulParams& p, ThreadPool& pool, CpuIsa isa) {
  CheckParams(p);
  std::vector<float> rounded;
  RunMatmul(WithRoundedInput(p, rounded), pool, Bf16RowsKernelFor(isa));
}

void MatmulBatch(std::span<const MatmulParams> given, ThreadPool& pool) {
  std::vector<std::vector<float>> rounded(given.size());
  std::vector<MatmulParams> jobs(given.size());
  for (size_t j = 0; j < given.size(); ++j) {
    CheckParams(given[j]);
    // Jobs reading the same input (a layer's projections of one x) share one rounding.
    const MatmulParams& g = given[j];
    size_t same = j;
    for (size_t i = 0; i < j && same == j; ++i) {
      const MatmulParams& a = given[i];
      if (jobs[i].x != a.x && a.x == g.x && a.x_stride == g.x_stride && a.m == g.m && a.w->cols == g.w->cols) same = i;
    }
    if (same < j && g.round_fp8_input && g.w->dtype == DType::kF8E4M3) {
      jobs[j] = g;
      jobs[j].x = jobs[same].x;
      jobs[j].x_stride = jobs[same].x_stride;
    } else {
      jobs[j] = WithRoundedInput(g, rounded[j]);
    }
  }
  // first[j]: the first block of job j in one index space over all of them.
  std::vector<int64_t> first(jobs.size() + 1, 0);
  std::vector<Bf16RowsKernel> kernels(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    first[j + 1] = first[j] + Blocks(jobs[j]);
    kernels[j] = DefaultKernel(jobs[j]);
  }
  pool.ParallelFor(first.back(), kGrainRows / kBf16RowsPerBlock, [&](int64_t b0, int64_t b1) {
    size_t j = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin()) - 1;
    for (int64_t b = b0; b < b1; ++j) {
      const int64_t end = std::min(b1, first[j + 1]);
      if (end > b) RunBlocks(jobs[j], kernels[j], b - first[j], end - first[j]);
      b = std::max(b, end);
    }
  });
}

}  // namespace tandem::cpu
