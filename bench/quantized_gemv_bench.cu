// The FP8 (128 x 128 block scales) and FP4 (e2m1, a scale per 32) matrix-vector products of
// kernels/cuda/quantized_gemv.h at decode shapes, against a device-to-device copy measured in
// the same run: weight bytes read per second over the copy's (bytes read + written) per
// second. Shapes: DeepSeek-V3/V4 attention-sized FP8 matrices and V4-Flash's routed experts
// of one token (6 experts' gate and up projections stacked, FP4), at 1, 4 and 8 rows; then
// the routed form (device-side expert ids) on one token's 6 of 64 V4-Flash-sized experts.
// CUDA events around batches of back-to-back launches, median of --iters batches. Each
// launch reads the next of several copies of the weights, together at least 4x the GPU's
// L2, so that no launch finds its weights in L2 from the one before (a 33 MiB matrix would
// otherwise stay in an H100's 50 MiB L2). JSON on stdout and to --json FILE.
//
//   quantized_gemv_bench [--json FILE] [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/cuda_bench_support.cuh"
#include "bench/cuda_check.h"
#include "kernels/cuda/quantized_gemv.h"

namespace {

using tandem::bench::FillFloats;
using tandem::bench::MedianMs;

__global__ void FillBytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint8_t b = static_cast<uint8_t>(tandem::bench::FillHash(i, seed));
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no FP8 NaN codes
    p[i] = b;
  }
}

struct Shape {
  const char* name;
  tandem::cuda::QuantizedWeight format;
  int64_t n, k;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(3, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: quantized_gemv_bench [--json FILE] [--iters N]\n"
                   "  FP8/FP4 GEMV weight bandwidth against a same-run device copy (bench/README.md)\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  // The reference: a 1 GiB device-to-device copy, bytes read + written per second.
  const size_t copy_bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  const double copy_ms = MedianMs(iters, 5, [&] { CHECK_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e6);
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));

  const std::vector<Shape> shapes = {
      {"fp8 q_b (V4-Flash: 64 x 512 heads, q_lora 1024)", tandem::cuda::QuantizedWeight::kFp8Block128, 32768, 1024},
      {"fp8 square 7168 (V3 hidden)", tandem::cuda::QuantizedWeight::kFp8Block128, 7168, 7168},
      {"fp8 o_proj-like 7168 x 16384", tandem::cuda::QuantizedWeight::kFp8Block128, 7168, 16384},
      {"fp4 6 experts' gate+up (V4-Flash: 2 x 2048 x 4096 each)", tandem::cuda::QuantizedWeight::kFp4Group32, 24576,
       4096},
      {"fp4 6 experts' down (4096 x 2048 each, stacked)", tandem::cuda::QuantizedWeight::kFp4Group32, 24576, 2048},
      {"fp4 tiled (tensor cores) 6 experts' gate+up", tandem::cuda::QuantizedWeight::kFp4Tiled, 24576, 4096},
      {"fp4 tiled (tensor cores) 6 experts' down", tandem::cuda::QuantizedWeight::kFp4Tiled, 24576, 2048},
  };
  std::string json = "{\"bench\": \"quantized_gemv\", \"device\": \"" + std::string(prop.name) +
                     "\", \"copy_gbs\": " + std::to_string(copy_gbs) + ", \"results\": [";
  bool first = true;
  // One result: a line on stdout and an entry of the JSON.
  auto report = [&](const char* name, int m, int64_t n, int64_t k, double bytes, double ms) {
    const double gbs = bytes / (ms * 1e6);
    std::printf("%-58s m %d: %8.1f us, %7.1f GB/s of weights, %.2f of the copy (%.0f GB/s)\n", name, m, ms * 1e3, gbs,
                gbs / copy_gbs, copy_gbs);
    json += std::string(first ? "" : ", ") + "{\"shape\": \"" + name + "\", \"m\": " + std::to_string(m) +
            ", \"n\": " + std::to_string(n) + ", \"k\": " + std::to_string(k) +
            ", \"weight_bytes\": " + std::to_string(static_cast<int64_t>(bytes)) + ", \"us\": " +
            std::to_string(ms * 1e3) + ", \"weight_gbs\": " + std::to_string(gbs) +
            ", \"of_copy\": " + std::to_string(gbs / copy_gbs) + "}";
    first = false;
  };
  for (const Shape& s : shapes) {
    const bool fp8 = s.format == tandem::cuda::QuantizedWeight::kFp8Block128;
    const size_t wbytes = static_cast<size_t>(s.n * (fp8 ? s.k : s.k / 2));
    const size_t nscales = fp8 ? static_cast<size_t>(((s.n + 127) / 128) * ((s.k + 127) / 128))
                               : static_cast<size_t>(s.n * (s.k / 32));
    // Copies of the weights, cycled through by the launches (see the top).
    const size_t copies = std::max<size_t>(2, (4 * static_cast<size_t>(prop.l2CacheSize) + wbytes - 1) / wbytes);
    uint8_t* w = nullptr;
    float *scales = nullptr, *x = nullptr, *y = nullptr;
    CHECK_CUDA(cudaMalloc(&w, wbytes * copies));
    CHECK_CUDA(cudaMalloc(&scales, nscales * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(8 * s.k) * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(8 * s.n) * sizeof(float)));
    FillBytes<<<1024, 256>>>(w, wbytes * copies, 7);
    FillFloats<<<256, 256>>>(scales, nscales, 0.01f);
    FillFloats<<<256, 256>>>(x, static_cast<size_t>(8 * s.k), 0.5f);
    CHECK_CUDA(cudaGetLastError());
    // FP8 also on the scalar kernel (the tensor-core form's reference in the same run).
    for (const bool scalar : fp8 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      for (int m : {1, 4, 8}) {
        if (tandem::cuda::QuantizedGemvSharedBytes(m, s.k) > tandem::cuda::kQuantizedGemvMaxSharedBytes) continue;
        tandem::cuda::QuantizedGemvParams p{.format = s.format, .w = w, .scales = scales, .x = x, .ldx = s.k,
                                            .y = y, .ldy = s.n, .m = m, .n = s.n, .k = s.k, .scalar = scalar};
        size_t next = 0;
        const double ms = MedianMs(iters, 20, [&] {
          p.w = w + (next++ % copies) * wbytes;
          CHECK_CUDA(tandem::cuda::QuantizedGemv(p, nullptr));
        });
        report((std::string(s.name) + (scalar ? " [scalar]" : "")).c_str(), m, s.n, s.k, static_cast<double>(wbytes),
               ms);
      }
    }
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(scales));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
  }
  // The routed form as a V4-Flash MoE layer runs it for one token: 6 of 64 experts (the
  // ids change every launch, so the experts' bytes come from memory), gate+up then down.
  {
    constexpr int kExperts = 64, kTopK = 6, kIdSets = 16;
    const int64_t d = 4096, inter = 2048;
    struct Routed {
      const char* name;
      int64_t n, k;
      bool tiled;  // the same bytes read as the tiled layout (fp4_tiled.h): the tensor-core form
      bool expert_tiles = true;  // QuantizedGemvParams::expert_tiles (false: a grid column per problem)
      int tokens = 1;            // tokens * 6 problems
    };
    for (const Routed& r :
         {Routed{"fp4 routed gate+up (6 of 64 experts, 4096 x 4096 each)", 2 * inter, d, false},
          Routed{"fp4 routed down (6 of 64 experts, 4096 x 2048 each)", d, inter, false},
          Routed{"fp4 routed gate+up, a grid column per problem", 2 * inter, d, false, false},
          Routed{"fp4 routed down, a grid column per problem", d, inter, false, false},
          Routed{"fp4 routed gate+up, 4 tokens (24 problems)", 2 * inter, d, false, true, 4},
          Routed{"fp4 routed down, 4 tokens (24 problems)", d, inter, false, true, 4},
          Routed{"fp4 routed gate+up, 4 tokens, a grid column per problem", 2 * inter, d, false, false, 4},
          Routed{"fp4 routed down, 4 tokens, a grid column per problem", d, inter, false, false, 4},
          Routed{"fp4 tiled routed gate+up (6 of 64 experts)", 2 * inter, d, true},
          Routed{"fp4 tiled routed down (6 of 64 experts)", d, inter, true}}) {
      const int problems = kTopK * r.tokens;
      const size_t wbytes = static_cast<size_t>(r.n * r.k / 2), nscales = static_cast<size_t>(r.n * (r.k / 32));
      uint8_t* w = nullptr;
      float *scales = nullptr, *x = nullptr, *y = nullptr;
      tandem::cuda::QuantizedMatrixRef* table = nullptr;
      int32_t* ids = nullptr;
      CHECK_CUDA(cudaMalloc(&w, wbytes * kExperts));
      CHECK_CUDA(cudaMalloc(&scales, nscales * kExperts * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(problems * r.k) * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(problems * r.n) * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&table, kExperts * sizeof(tandem::cuda::QuantizedMatrixRef)));
      CHECK_CUDA(cudaMalloc(&ids, kIdSets * problems * sizeof(int32_t)));
      FillBytes<<<1024, 256>>>(w, wbytes * kExperts, 11);
      FillFloats<<<256, 256>>>(scales, nscales * kExperts, 0.01f);
      FillFloats<<<256, 256>>>(x, static_cast<size_t>(problems * r.k), 0.5f);
      CHECK_CUDA(cudaGetLastError());
      std::vector<tandem::cuda::QuantizedMatrixRef> refs(kExperts);
      for (int e = 0; e < kExperts; ++e) refs[e] = {.w = w + e * wbytes, .scales = scales + e * nscales};
      CHECK_CUDA(cudaMemcpy(table, refs.data(), kExperts * sizeof(refs[0]), cudaMemcpyHostToDevice));
      std::vector<int32_t> host_ids;
      uint32_t state = 12345;
      for (int set = 0; set < kIdSets * r.tokens; ++set) {  // a token's 6 distinct experts
        std::vector<int32_t> chosen;
        while (static_cast<int>(chosen.size()) < kTopK) {
          state = state * 1664525u + 1013904223u;
          const int32_t e = static_cast<int32_t>((state >> 8) % kExperts);
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        host_ids.insert(host_ids.end(), chosen.begin(), chosen.end());
      }
      CHECK_CUDA(cudaMemcpy(ids, host_ids.data(), host_ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      tandem::cuda::QuantizedGemvParams p{.format = r.tiled ? tandem::cuda::QuantizedWeight::kFp4Tiled
                                                            : tandem::cuda::QuantizedWeight::kFp4Group32,
                                          .x = x, .ldx = r.k,
                                          .y = y, .ldy = r.n, .m = 1, .n = r.n, .k = r.k, .experts = table,
                                          .num_experts = kExperts, .problems = problems,
                                          .x_group = r.n == 2 * inter ? kTopK : 1, .expert_tiles = r.expert_tiles};
      size_t next = 0;
      const double ms = MedianMs(iters, 20, [&] {
        p.ids = ids + (next++ % kIdSets) * problems;
        CHECK_CUDA(tandem::cuda::QuantizedGemv(p, nullptr));
      });
      // Bytes: the distinct experts' codes (a 4-token batch shares some; scales not counted).
      double experts_read = 0;  // the mean over the id sets the launches cycle through
      for (int set = 0; set < kIdSets; ++set) {
        std::vector<int32_t> distinct(host_ids.begin() + set * problems, host_ids.begin() + (set + 1) * problems);
        std::sort(distinct.begin(), distinct.end());
        experts_read += static_cast<double>(std::unique(distinct.begin(), distinct.end()) - distinct.begin()) / kIdSets;
      }
      report(r.name, r.tokens, r.n, r.k, static_cast<double>(wbytes) * experts_read, ms);
      CHECK_CUDA(cudaFree(w));
      CHECK_CUDA(cudaFree(scales));
      CHECK_CUDA(cudaFree(x));
      CHECK_CUDA(cudaFree(y));
      CHECK_CUDA(cudaFree(table));
      CHECK_CUDA(cudaFree(ids));
    }
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "%s\n", json.c_str());
      std::fclose(f);
    }
  }
  return 0;
}
