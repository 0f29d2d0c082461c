// MLA attention kernels against references measured in the same run (bench/README.md):
//  - paged decode (kv_lora_rank 512 + rope 64, bf16 cache, block 64, shuffled block
//    tables) for 16 and 128 query heads, batch 64 and 128, cache 4K-32K: kernel time,
//    KV bytes read per second against a large device-to-device copy (bytes read + written
//    per second), and TFLOP/s (2 x batch x heads x cache_len x (576 + 512)) against cuBLAS
//    bf16 GEMM (8192^3);
//  - causal prefill attention of 8192 tokens at DeepSeek-V2-Lite shapes (16 heads, nope
//    128, rope 64, v 128): TFLOP/s against the same GEMM.
// CUDA events around batches of back-to-back launches, median of --iters batches after
// warm-up, each measurement after 100 ms of idle GPU; the references are measured at the
// start (the ratios use these) and again at the end. JSON on stdout and to --json FILE.
//
//   mla_decode_bench [--json FILE] [--iters N] [--quick] [--sweep]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/cuda_check.h"
#include "kernels/cuda/mla_decode_attention.h"
#include "kernels/cuda/mla_prefill_attention.h"

namespace {

// Uniform values in [-2, 2) from a hash of the index: never zeros, never repeating tiles.
__global__ void FillBf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x) * (4.0f / 4294967296.0f) - 2.0f);
  }
}
void Fill(__nv_bfloat16* p, size_t n, uint32_t seed) {
  FillBf16<<<1024, 256>>>(p, n, seed);
  CHECK_CUDA(cudaGetLastError());
}

// Median over `iters` samples of the milliseconds per run of fn, each sample `reps` runs
// back to back between two events (so the host-side launch work overlaps the previous
// run, as in a CUDA-graph decode step), after `warmup` runs.
// Every measurement starts from an idle GPU (100 ms), so that none inherits the power
// state or dirty L2 lines of the one before.
template <typename Fn>
double MedianMs(int warmup, int iters, int reps, Fn&& fn) {
  CHECK_CUDA(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    for (int r = 0; r < reps; ++r) fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / reps);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Options {
  std::string json;
  int iters = 10;
  bool quick = false;
  bool sweep = false;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      opt.json = argv[++i];
    } else if (a == "--iters" && i + 1 < argc) {
      opt.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--sweep") {
      opt.sweep = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--iters N] [--quick] [--sweep]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::string json = "{\n  \"device\": \"" + std::string(prop.name) + "\", \"sm\": " +
                     std::to_string(prop.major * 10 + prop.minor) +
                     ", \"multiprocessors\": " + std::to_string(prop.multiProcessorCount) + ",\n";
  char buf[512];

  // References, kept allocated: measured at the start (the ratios' denominators) and again
  // at the end (a check that the card's state did not drift).
  // 1: device-to-device copy, bytes read + written per second.
  const size_t copy_bytes = size_t{2} << 30;
  void *copy_src, *copy_dst;
  CHECK_CUDA(cudaMalloc(&copy_src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&copy_dst, copy_bytes));
  Fill(static_cast<__nv_bfloat16*>(copy_src), copy_bytes / 2, 1);
  auto measure_copy = [&](int iters) {
    const double ms = MedianMs(2, iters, 3, [&] {
      CHECK_CUDA(cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice));
    });
    return 2.0 * copy_bytes / (ms * 1e-3) / 1e9;
  };
  // 2: cuBLAS bf16 GEMM, fp32 accumulate, 8192^3, random data.
  const int gn = 8192;
  __nv_bfloat16 *gA, *gB, *gC;
  CHECK_CUDA(cudaMalloc(&gA, size_t{2} * gn * gn));
  CHECK_CUDA(cudaMalloc(&gB, size_t{2} * gn * gn));
  CHECK_CUDA(cudaMalloc(&gC, size_t{2} * gn * gn));
  Fill(gA, size_t{1} * gn * gn, 2);
  Fill(gB, size_t{1} * gn * gn, 3);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  auto measure_gemm = [&](int iters) {
    const float alpha = 1.0f, beta = 0.0f;
    const double ms = MedianMs(2, iters, 3, [&] {
      if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, gn, gn, gn, &alpha, gA, CUDA_R_16BF, gn, gB, CUDA_R_16BF, gn,
                       &beta, gC, CUDA_R_16BF, gn, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx failed\n");
        std::exit(1);
      }
    });
    return 2.0 * gn * gn * static_cast<double>(gn) / (ms * 1e-3) / 1e12;
  };
  const double copy_gbps = measure_copy(10);
  const double gemm_tflops = measure_gemm(10);
  std::snprintf(buf, sizeof buf,
                "  \"copy_d2d_read_plus_write_GBps\": %.1f,\n  \"cublas_bf16_gemm_8192_TFLOPs\": %.1f,\n", copy_gbps,
                gemm_tflops);
  json += buf;
  std::fprintf(stderr, "references at start: copy %.1f GB/s (read+write), cuBLAS bf16 GEMM %.1f TFLOP/s\n", copy_gbps,
               gemm_tflops);

  // Decode.
  const int R = 512, P = 64, D = R + P, kBlock = 64;
  const std::vector<int> batches = opt.quick ? std::vector<int>{64} : std::vector<int>{64, 128};
  const std::vector<int> lens = opt.quick ? std::vector<int>{4096, 32768} : std::vector<int>{4096, 8192, 16384, 32768};
  const int max_b = *std::max_element(batches.begin(), batches.end());
  const int max_len = *std::max_element(lens.begin(), lens.end());
  const int blocks_per_seq = max_len / kBlock;
  const size_t num_blocks = static_cast<size_t>(max_b) * blocks_per_seq;
  __nv_bfloat16* cache;
  CHECK_CUDA(cudaMalloc(&cache, num_blocks * kBlock * D * 2));
  Fill(cache, num_blocks * kBlock * D, 4);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  int32_t *tables, *cache_lens;
  CHECK_CUDA(cudaMalloc(&tables, ids.size() * 4));
  CHECK_CUDA(cudaMemcpy(tables, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&cache_lens, max_b * 4));
  __nv_bfloat16* q;
  float* out;
  const int max_heads = 128;
  CHECK_CUDA(cudaMalloc(&q, size_t{2} * max_b * max_heads * D));
  Fill(q, size_t{1} * max_b * max_heads * D, 6);
  CHECK_CUDA(cudaMalloc(&out, size_t{4} * max_b * max_heads * R));
  size_t ws_bytes = 0;
  for (int h : {16, 128}) {
    for (int b : batches) ws_bytes = std::max(ws_bytes, tandem::cuda::MlaDecodeWorkspaceBytes(b, 1, h, R, max_len));
    for (int s : {2, 4, 8}) ws_bytes = std::max(ws_bytes, tandem::cuda::MlaDecodeWorkspaceBytesForSplits(max_b, 1, h, R, s));
  }
  void* ws = nullptr;
  if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));

  json += "  \"decode\": [\n";
  bool first = true;
  std::fprintf(stderr, "%6s %6s %7s %6s %7s %10s %9s %8s %8s %8s\n", "heads", "batch", "len", "impl", "splits", "time_us",
               "KV_GB/s", "vs_copy", "TFLOP/s", "vs_gemm");
  for (int heads : {16, 128}) {
    for (int b : batches) {
      for (int len : lens) {
        std::vector<int32_t> lens_host(b, len);
        CHECK_CUDA(cudaMemcpy(cache_lens, lens_host.data(), b * 4, cudaMemcpyHostToDevice));
        tandem::cuda::MlaDecodeParams p;
        p.q = q;
        p.q_stride = static_cast<int64_t>(heads) * D;
        p.kv_cache = cache;
        p.block_tables = tables;
        p.cache_lens = cache_lens;
        p.num_seqs = b;
        p.q_per_seq = 1;
        p.num_heads = heads;
        p.kv_lora_rank = R;
        p.rope_dim = P;
        p.block_size = kBlock;
        p.max_blocks_per_seq = blocks_per_seq;
        p.max_cache_len = len;
        p.softmax_scale = 0.0416667f;
        p.out = out;
        p.out_stride = static_cast<int64_t>(heads) * R;
        p.workspace = ws;
        p.workspace_bytes = ws_bytes;
        // Automatic choice (wgmma on sm_90), then the portable kernel forced.
        std::vector<int> impls = {0};
        if (prop.major == 9) impls.push_back(1);
        for (int impl : impls) {
          std::vector<int> split_opts = {0};
          if (opt.sweep && impl == 0) split_opts.insert(split_opts.end(), {1, 2, 4, 8});
          for (int splits : split_opts) {
            p.impl = impl;
            p.num_splits = splits;
            const double ms =
                MedianMs(2, opt.iters, 10, [&] { CHECK_CUDA(tandem::cuda::MlaDecodeAttention(p, nullptr)); });
            const double kv_bytes = 2.0 * b * static_cast<double>(len) * D;
            const double flops = 2.0 * b * heads * static_cast<double>(len) * (D + R);
            const double gbps = kv_bytes / (ms * 1e-3) / 1e9, tflops = flops / (ms * 1e-3) / 1e12;
            const char* impl_name = impl == 1 || prop.major != 9 ? "mma" : "wgmma";
            std::fprintf(stderr, "%6d %6d %7d %6s %7s %10.1f %9.1f %8.3f %8.1f %8.3f\n", heads, b, len, impl_name,
                         splits == 0 ? "auto" : std::to_string(splits).c_str(), ms * 1e3, gbps, gbps / copy_gbps,
                         tflops, tflops / gemm_tflops);
            std::snprintf(buf, sizeof buf,
                          "%s    {\"heads\": %d, \"batch\": %d, \"cache_len\": %d, \"kernel\": \"%s\", \"splits\": \"%s\", "
                          "\"time_us\": %.2f, \"kv_GBps\": %.1f, \"kv_GBps_over_copy\": %.4f, \"TFLOPs\": %.2f, "
                          "\"TFLOPs_over_gemm\": %.4f}",
                          first ? "" : ",\n", heads, b, len, impl_name,
                          splits == 0 ? "auto" : std::to_string(splits).c_str(), ms * 1e3, gbps, gbps / copy_gbps,
                          tflops, tflops / gemm_tflops);
            json += buf;
            first = false;
          }
        }
      }
    }
  }
  json += "\n  ],\n";
  CHECK_CUDA(cudaFree(cache));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(cache_lens));
  CHECK_CUDA(cudaFree(q));
  CHECK_CUDA(cudaFree(out));
  if (ws != nullptr) CHECK_CUDA(cudaFree(ws));

  // Prefill: 8192 tokens, DeepSeek-V2-Lite attention shapes, one chunk from position 0.
  {
    const int n = 8192, heads = 16, nope = 128, rope = 64, v = 128;
    __nv_bfloat16 *pq, *pkv, *prope;
    float* pout;
    CHECK_CUDA(cudaMalloc(&pq, size_t{2} * n * heads * (nope + rope)));
    CHECK_CUDA(cudaMalloc(&pkv, size_t{2} * n * heads * (nope + v)));
    CHECK_CUDA(cudaMalloc(&prope, size_t{2} * n * rope));
    CHECK_CUDA(cudaMalloc(&pout, size_t{4} * n * heads * v));
    Fill(pq, size_t{1} * n * heads * (nope + rope), 7);
    Fill(pkv, size_t{1} * n * heads * (nope + v), 8);
    Fill(prope, size_t{1} * n * rope, 9);
    tandem::cuda::MlaPrefillParams p;
    p.q = pq;
    p.k_nope = pkv;
    p.v = pkv + nope;
    p.k_rope = prope;
    p.q_stride = static_cast<int64_t>(heads) * (nope + rope);
    p.k_nope_stride = p.v_stride = static_cast<int64_t>(heads) * (nope + v);  // kv_b's output as it is
    p.k_nope_head_stride = p.v_head_stride = nope + v;
    p.k_rope_stride = rope;
    p.num_q = p.num_kv = n;
    p.num_heads = heads;
    p.nope_dim = nope;
    p.rope_dim = rope;
    p.v_dim = v;
    p.softmax_scale = 0.0722f;
    p.out = pout;
    p.out_stride = static_cast<int64_t>(heads) * v;
    // Causal: query i scores i + 1 keys; QK^T over nope + rope, P·V over v.
    const double flops = 2.0 * heads * (static_cast<double>(n) * (n + 1) / 2) * (nope + rope + v);
    json += "  \"prefill\": [\n";
    std::vector<int> impls = {0};
    if (prop.major == 9) impls.push_back(1);  // the portable kernel too
    for (size_t k = 0; k < impls.size(); ++k) {
      p.impl = impls[k];
      const double ms = MedianMs(2, std::max(5, opt.iters / 2), 5, [&] {
        CHECK_CUDA(tandem::cuda::MlaPrefillAttention(p, nullptr));
      });
      const double tflops = flops / (ms * 1e-3) / 1e12;
      const char* name = impls[k] == 1 || prop.major != 9 ? "mma" : "wgmma";
      std::fprintf(stderr, "prefill %d tokens, %d heads, nope %d rope %d v %d, %s: %.1f us, %.1f TFLOP/s (%.3f of GEMM)\n",
                   n, heads, nope, rope, v, name, ms * 1e3, tflops, tflops / gemm_tflops);
      std::snprintf(buf, sizeof buf,
                    "    {\"tokens\": %d, \"heads\": %d, \"nope\": %d, \"rope\": %d, \"v\": %d, \"kernel\": \"%s\", "
                    "\"time_us\": %.1f, \"TFLOPs\": %.2f, \"TFLOPs_over_gemm\": %.4f}%s\n",
                    n, heads, nope, rope, v, name, ms * 1e3, tflops, tflops / gemm_tflops, k + 1 < impls.size() ? "," : "");
      json += buf;
    }
    json += "  ],\n";
    CHECK_CUDA(cudaFree(pq));
    CHECK_CUDA(cudaFree(pkv));
    CHECK_CUDA(cudaFree(prope));
    CHECK_CUDA(cudaFree(pout));
  }
  const double copy_end = measure_copy(10), gemm_end = measure_gemm(10);
  std::fprintf(stderr, "references at end: copy %.1f GB/s, cuBLAS bf16 GEMM %.1f TFLOP/s\n", copy_end, gemm_end);
  std::snprintf(buf, sizeof buf,
                "  \"copy_d2d_read_plus_write_GBps_at_end\": %.1f,\n  \"cublas_bf16_gemm_8192_TFLOPs_at_end\": %.1f\n}\n",
                copy_end, gemm_end);
  json += buf;
  cublasDestroy(handle);
  CHECK_CUDA(cudaFree(gA));
  CHECK_CUDA(cudaFree(gB));
  CHECK_CUDA(cudaFree(gC));
  CHECK_CUDA(cudaFree(copy_src));
  CHECK_CUDA(cudaFree(copy_dst));
  std::fputs(json.c_str(), stdout);
  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", opt.json.c_str());
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
