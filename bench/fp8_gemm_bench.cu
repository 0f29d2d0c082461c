// Block-scaled FP8 GEMM (kernels/cuda/fp8_gemm.h) at prefill shapes against, in the same run
// and on the same operands: cuBLASLt's FP8 GEMM with the same block scaling (1 x 128 for the
// activations, 128 x 128 for the weights; cuBLAS 12.9+ on Hopper), cuBLASLt's FP8 GEMM with
// one scale per tensor (its fastest FP8 form, a looser reference), and cuBLAS's bf16 GEMM
// (what the engine runs today). Output bf16 [m][n] in every case. Also the activation
// quantizer's time (bf16 [m][k] -> e4m3 + scales), which an FP8 linear adds. Shapes:
// DeepSeek-V3's linears (N x K as DeepGEMM's benchmarks list them) and V2-Lite's, at 4096
// and 8192 tokens. Rounds of back-to-back launches, the variants interleaved round by round,
// median per variant. cuBLASLt's block-scaled output is compared with ours (relative L2):
// the two must compute the same product. JSON on stdout and to --json FILE.
//
//   fp8_gemm_bench [--json FILE] [--rounds N] [--tokens 4096,8192]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/cuda_bench_support.cuh"
#include "bench/cuda_check.h"
#include "bench/cublaslt_fp8.h"
#include "kernels/cuda/cublas_gemm.h"
#include "kernels/cuda/fp8_gemm.h"

namespace {

using tandem::bench::BatchMs;
using tandem::bench::FillFloats;
using tandem::bench::LtFp8;
using tandem::bench::Median;

__global__ void FillFp8(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t x = tandem::bench::FillHash(i, seed);
    // |value| in [2^-3, 2^5): spread like quantized data, no NaN codes.
    p[i] = static_cast<uint8_t>((x & 0x80) | (0x20 + (x >> 8) % 0x40));
  }
}

__global__ void FillBf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16((static_cast<float>(tandem::bench::FillHash(i, seed) % 2001) - 1000.0f) / 500.0f);
  }
}

struct Shape {
  const char* model;
  const char* name;
  int n, k;
};

double RelativeL2(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double e2 = 0.0, r2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t gb = static_cast<uint32_t>(got[i]) << 16, wb = static_cast<uint32_t>(want[i]) << 16;
    float g, w;
    std::memcpy(&g, &gb, 4);
    std::memcpy(&w, &wb, 4);
    e2 += (static_cast<double>(g) - w) * (static_cast<double>(g) - w);
    r2 += static_cast<double>(w) * w;
  }
  return std::sqrt(e2 / std::max(r2, 1e-300));
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof(b), "%.4g", v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int rounds = 7;
  std::vector<int> token_counts = {4096, 8192};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      token_counts.clear();
      for (const char* s = argv[++i]; *s;) {
        token_counts.push_back(std::atoi(s));
        while (*s && *s != ',') ++s;
        if (*s == ',') ++s;
      }
    } else {
      std::fprintf(stderr,
                   "usage: fp8_gemm_bench [--json FILE] [--rounds N] [--tokens M1,M2,...]\n"
                   "  --json FILE    also write the JSON report to FILE\n"
                   "  --rounds N     timed rounds per variant, interleaved (default 7, at least 3)\n"
                   "  --tokens LIST  row counts m to run every shape at (default 4096,8192)\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (!tandem::cuda::Fp8GemmSupported()) {
    std::fprintf(stderr, "fp8_gemm_bench: Fp8Gemm needs an sm_90 GPU (this is %s)\n", prop.name);
    return 1;
  }
  const Shape shapes[] = {
      {"deepseek-v3", "q_a+kv_a 2112x7168", 2112, 7168}, {"deepseek-v3", "q_b 24576x1536", 24576, 1536},
      {"deepseek-v3", "kv_b 32768x512", 32768, 512},     {"deepseek-v3", "o_proj 7168x16384", 7168, 16384},
      {"deepseek-v3", "shared gate_up 4096x7168", 4096, 7168}, {"deepseek-v3", "shared down 7168x2048", 7168, 2048},
      {"deepseek-v3", "dense gate_up 36864x7168", 36864, 7168}, {"deepseek-v3", "dense down 7168x18432", 7168, 18432},
      {"deepseek-v2-lite", "q 3072x2048", 3072, 2048},   {"deepseek-v2-lite", "o_proj 2048x2048", 2048, 2048},
      {"deepseek-v2-lite", "dense gate_up 21888x2048", 21888, 2048}, {"deepseek-v2-lite", "dense down 2048x10944", 2048, 10944},
  };
  int max_m = 0;
  int64_t max_nk = 0, max_mk = 0, max_mn = 0;
  for (int m : token_counts) max_m = std::max(max_m, m);
  for (const Shape& s : shapes) {
    max_nk = std::max<int64_t>(max_nk, int64_t{s.n} * s.k);
    max_mk = std::max<int64_t>(max_mk, int64_t{max_m} * s.k);
    max_mn = std::max<int64_t>(max_mn, int64_t{max_m} * s.n);
  }
  uint8_t *x8, *w8;
  __nv_bfloat16 *xb, *wb, *y_ours, *y_lt, *y_bf16;
  float *x_scales, *w_scales, *ones;
  CHECK_CUDA(cudaMalloc(&x8, max_mk));
  CHECK_CUDA(cudaMalloc(&w8, max_nk));
  CHECK_CUDA(cudaMalloc(&xb, max_mk * 2));
  CHECK_CUDA(cudaMalloc(&wb, max_nk * 2));
  CHECK_CUDA(cudaMalloc(&y_ours, max_mn * 2));
  CHECK_CUDA(cudaMalloc(&y_lt, max_mn * 2));
  CHECK_CUDA(cudaMalloc(&y_bf16, max_mn * 2));
  CHECK_CUDA(cudaMalloc(&x_scales, (max_mk / 128 + 128) * 4));
  CHECK_CUDA(cudaMalloc(&w_scales, (max_nk / 128 / 128 + 1024) * 4));
  CHECK_CUDA(cudaMalloc(&ones, 2 * 4));
  FillFp8<<<1024, 256>>>(x8, max_mk, 1);
  FillFp8<<<1024, 256>>>(w8, max_nk, 2);
  FillBf16<<<1024, 256>>>(xb, max_mk, 3);
  FillBf16<<<1024, 256>>>(wb, max_nk, 4);
  FillFloats<<<256, 256>>>(x_scales, max_mk / 128 + 128, 1.0f / 64);
  FillFloats<<<256, 256>>>(w_scales, max_nk / 128 / 128 + 1024, 1.0f / 256);
  FillFloats<<<1, 32>>>(ones, 2, 1.0f);
  CHECK_CUDA(cudaDeviceSynchronize());
  const size_t workspace_bytes = size_t{64} << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  tandem::cuda::CublasGemm cublas;
  CHECK_CUBLAS(cublas.Init());
  cudaEvent_t ev_a, ev_b;
  CHECK_CUDA(cudaEventCreate(&ev_a));
  CHECK_CUDA(cudaEventCreate(&ev_b));

  std::string json = "{\"bench\": \"fp8_gemm\", \"device\": \"" + std::string(prop.name) +
                     "\", \"sms\": " + std::to_string(prop.multiProcessorCount) + ", \"rounds\": " +
                     std::to_string(rounds) + ", \"output\": \"bf16\", \"shapes\": [";
  bool first = true;
  std::vector<double> ratios_block, ratios_tensor, ratios_bf16;
  for (int m : token_counts) {
    for (const Shape& s : shapes) {
      const int n = s.n, k = s.k;
      const double flops = 2.0 * m * n * k;
      tandem::cuda::Fp8GemmParams ours{.a = x8, .lda = k, .a_scales = x_scales, .a_scales_stride = m, .b = w8,
                                       .ldb = k, .b_scales = w_scales, .y = y_ours, .ldy = n, .y_bf16 = true,
                                       .m = m, .n = n, .k = k};
      auto run_ours = [&] { CHECK_CUDA(tandem::cuda::Fp8Gemm(ours, nullptr)); };
      // The kernel's forms, both timed: 128x128 or 128x256 tiles.
      constexpr int kForms = 2;
      tandem::cuda::Fp8GemmParams forms[kForms];
      for (int f = 0; f < kForms; ++f) {
        forms[f] = ours;
        forms[f].wide_tiles = f == 1;
      }
      auto run_form = [&](int f) { CHECK_CUDA(tandem::cuda::Fp8Gemm(forms[f], nullptr)); };
      std::unique_ptr<LtFp8> block_forms[2];
      for (int form = 0; form < 2; ++form) {
        block_forms[form] = std::make_unique<LtFp8>(lt, LtFp8::Scaling::kBlock, form == 1, m, n, k, x8, x_scales, w8,
                                                    w_scales, y_lt, workspace, workspace_bytes);
      }
      LtFp8& lt_block = block_forms[0]->ok() ? *block_forms[0] : *block_forms[1];
      LtFp8 lt_tensor(lt, LtFp8::Scaling::kTensor, false, m, n, k, x8, ones, w8, ones + 1, y_lt, workspace,
                      workspace_bytes);
      auto run_bf16 = [&] {
        CHECK_CUBLAS(cublas.Linear({.x = xb, .ldx = k, .w = wb, .ldw = k, .y = y_bf16, .ldy = n, .y_bf16 = true,
                                .m = m, .n = n, .k = k},
                               nullptr));
      };
      tandem::cuda::Fp8QuantizeRowsParams quant{.x = xb, .x_bf16 = true, .ldx = k, .q = x8, .ldq = k,
                                                .scales = x_scales, .scales_stride = m, .m = m, .k = k};
      // Agreement first (the quantizer's output then stands for the activations).
      CHECK_CUDA(tandem::cuda::Fp8QuantizeRows(quant, nullptr));
      run_ours();
      double agreement = NAN;
      if (lt_block.ok()) {
        lt_block.Run();
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<uint16_t> a(static_cast<size_t>(m) * n), b(a.size());
        CHECK_CUDA(cudaMemcpy(a.data(), y_ours, a.size() * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(b.data(), y_lt, b.size() * 2, cudaMemcpyDeviceToHost));
        if (lt_block.transposed()) {  // y^T [n][m]
          std::vector<uint16_t> t(b.size());
          for (int i = 0; i < m; ++i) {
            for (int j = 0; j < n; ++j) t[static_cast<size_t>(i) * n + j] = b[static_cast<size_t>(j) * m + i];
          }
          b.swap(t);
        }
        agreement = RelativeL2(a, b);
      }
      // Every form computes the default's bits (the same sums in the same order, other tiles).
      int forms_differing = 0;
      {
        std::vector<uint16_t> want(static_cast<size_t>(m) * n), got(want.size());
        CHECK_CUDA(cudaMemcpy(want.data(), y_ours, want.size() * 2, cudaMemcpyDeviceToHost));
        for (int f = 0; f < kForms; ++f) {
          if (forms[f].wide_tiles == ours.wide_tiles) continue;  // the default itself
          CHECK_CUDA(cudaMemset(y_ours, 0xff, got.size() * 2));
          run_form(f);
          CHECK_CUDA(cudaMemcpy(got.data(), y_ours, got.size() * 2, cudaMemcpyDeviceToHost));
          forms_differing += got != want;
        }
      }
      if (forms_differing > 0) {
        std::fprintf(stderr, "fp8_gemm_bench: %d forms of the kernel differ from the default's output at m %d, %s\n",
                     forms_differing, m, s.name);
        return 1;
      }
      const int reps = std::max(3, static_cast<int>(2e12 / flops));  // ~ a few ms per batch
      for (int i = 0; i < 2; ++i) {
        for (int f = 0; f < kForms; ++f) run_form(f);
        run_bf16();
        if (lt_block.ok()) lt_block.Run();
        if (lt_tensor.ok()) lt_tensor.Run();
      }
      std::vector<double> t_form[kForms], t_block, t_tensor, t_bf16, t_quant;
      for (int r = 0; r < rounds; ++r) {
        for (int f = 0; f < kForms; ++f) t_form[f].push_back(BatchMs(reps, [&] { run_form(f); }, ev_a, ev_b));
        if (lt_block.ok()) t_block.push_back(BatchMs(reps, [&] { lt_block.Run(); }, ev_a, ev_b));
        if (lt_tensor.ok()) t_tensor.push_back(BatchMs(reps, [&] { lt_tensor.Run(); }, ev_a, ev_b));
        t_bf16.push_back(BatchMs(reps, run_bf16, ev_a, ev_b));
        t_quant.push_back(BatchMs(reps, [&] { CHECK_CUDA(tandem::cuda::Fp8QuantizeRows(quant, nullptr)); }, ev_a, ev_b));
      }
      double ms_form[kForms];
      for (int f = 0; f < kForms; ++f) ms_form[f] = Median(t_form[f]);
      // "ours": the fastest form for this shape (all reported).
      const double ms_ours = *std::min_element(ms_form, ms_form + kForms), ms_bf16 = Median(t_bf16), ms_quant = Median(t_quant);
      const double ms_block = t_block.empty() ? NAN : Median(t_block);
      const double ms_tensor = t_tensor.empty() ? NAN : Median(t_tensor);
      auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
      if (std::isfinite(ms_block)) ratios_block.push_back(ms_block / ms_ours);
      if (std::isfinite(ms_tensor)) ratios_tensor.push_back(ms_tensor / ms_ours);
      ratios_bf16.push_back(ms_bf16 / ms_ours);
      std::fprintf(stderr,
                   "m %5d %-18s %-26s ours %7.1f TF/s (128x128 %.1f, 128x256 %.1f) | cuBLASLt block %7.1f (ours/it %.2f, rel.diff %.2g) | "
                   "cuBLASLt tensor %7.1f (%.2f) | bf16 %7.1f (%.2f) | quantize %.1f us\n",
                   m, s.model, s.name, tflops(ms_ours), tflops(ms_form[0]), tflops(ms_form[1]), tflops(ms_block), ms_block / ms_ours, agreement,
                   tflops(ms_tensor), ms_tensor / ms_ours, tflops(ms_bf16), ms_bf16 / ms_ours, ms_quant * 1e3);
      json += std::string(first ? "" : ", ") + "{\"model\": \"" + s.model + "\", \"shape\": \"" + s.name +
              "\", \"m\": " + std::to_string(m) + ", \"n\": " + std::to_string(n) + ", \"k\": " + std::to_string(k) +
              ", \"ours_tflops\": " + Num(tflops(ms_ours)) + ", \"ours_128x128_tflops\": " + Num(tflops(ms_form[0])) +
              ", \"ours_128x256_tflops\": " + Num(tflops(ms_form[1])) +
 ", \"cublaslt_block_tflops\": " + Num(tflops(ms_block)) +
              ", \"cublaslt_block_status\": " + std::to_string(lt_block.status()) +
              ", \"cublaslt_block_activations_as_a\": " + (lt_block.transposed() ? "true" : "false") +
              ", \"cublaslt_tensor_tflops\": " + Num(tflops(ms_tensor)) + ", \"cublas_bf16_tflops\": " +
              Num(tflops(ms_bf16)) + ", \"ours_over_cublaslt_block\": " + Num(ms_block / ms_ours) +
              ", \"ours_over_cublaslt_tensor\": " + Num(ms_tensor / ms_ours) + ", \"ours_over_cublas_bf16\": " +
              Num(ms_bf16 / ms_ours) + ", \"quantize_us\": " + Num(ms_quant * 1e3) +
              ", \"ours_with_quantize_over_cublas_bf16\": " + Num(ms_bf16 / (ms_ours + ms_quant)) +
              ", \"relative_l2_vs_cublaslt_block\": " + Num(agreement) + "}";
      first = false;
    }
  }
  auto min_of = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::min_element(v.begin(), v.end()); };
  auto median_of = [](const std::vector<double>& v) { return v.empty() ? NAN : Median(v); };
  json += "], \"min_ours_over_cublaslt_block\": " + Num(min_of(ratios_block)) +
          ", \"median_ours_over_cublaslt_block\": " + Num(median_of(ratios_block)) +
          ", \"min_ours_over_cublaslt_tensor\": " + Num(min_of(ratios_tensor)) +
          ", \"median_ours_over_cublaslt_tensor\": " + Num(median_of(ratios_tensor)) +
          ", \"min_ours_over_cublas_bf16\": " + Num(min_of(ratios_bf16)) + "}\n";
  std::fputs(json.c_str(), stdout);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::perror(json_path.c_str());
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
