// Experiment behind docs/performance.md "Bulk-async (TMA) weight streaming, measured and dropped":
// streaming-read bandwidth of register loads (the expert GEMV's way) vs cp.async.bulk into a
// shared-memory ring, at the expert GEMV's launch sizes. Not built by CMake; on an sm_90 GPU:
//   nvcc -O2 -arch=sm_90a -std=c++17 -o weight_stream_bench docs/experiments/weight_stream_bench.cu && ./weight_stream_bench
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ uint4 Ld(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// tile = tile_bytes contiguous; block handles tiles b, b+grid, ...; each thread 16 uint4 per 64 KB
template <int U>
__global__ void __launch_bounds__(256, 2) RegKernel(const uint4* w, int tiles, int tile_chunks, unsigned* out) {
  unsigned acc = 0;
  uint4 v[U];
  int j = blockIdx.x;
  auto load = [&](int t) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = u * 256 + threadIdx.x;
      v[u] = c < tile_chunks ? Ld(w + (size_t)t * tile_chunks + c) : make_uint4(0, 0, 0, 0);
    }
  };
  if (j < tiles) load(j);
  while (j < tiles) {
    unsigned s = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) s ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    acc += s;
    j += gridDim.x;
    if (j < tiles) load(j);
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ uint32_t Smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
template <int S>
__global__ void __launch_bounds__(256, 1) BulkKernel(const char* w, int tiles, int tile_bytes, unsigned* out) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) uint64_t bar[S];
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(Smem(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int q) {  // item q of this block into stage q % S
    const int t = blockIdx.x + q * gridDim.x;
    if (t >= tiles) return;
    const int s = q % S;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(Smem(&bar[s])), "r"(tile_bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(Smem(ring + (size_t)s * tile_bytes)), "l"(w + (size_t)t * tile_bytes), "r"(tile_bytes), "r"(Smem(&bar[s])) : "memory");
  };
  if (threadIdx.x == 0) for (int q = 0; q < S; ++q) issue(q);
  unsigned acc = 0;
  for (int q = 0; blockIdx.x + q * gridDim.x < tiles; ++q) {
    const int s = q % S;
    const uint32_t parity = (q / S) & 1;
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" :: "r"(Smem(&bar[s])), "r"(parity) : "memory");
    const uint4* st = reinterpret_cast<const uint4*>(ring + (size_t)s * tile_bytes);
    unsigned x = 0;
    for (int c = threadIdx.x; c < tile_bytes / 16; c += 256) { uint4 v = st[c]; x ^= v.x ^ v.y ^ v.z ^ v.w; }
    acc += x;
    __syncthreads();
    if (threadIdx.x == 0) issue(q + S);
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t region = 4ull << 30;
  char* buf; CK(cudaMalloc(&buf, region)); CK(cudaMemset(buf, 1, region));
  unsigned* out; CK(cudaMalloc(&out, 4));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  // copy reference
  { char* dst; CK(cudaMalloc(&dst, 1ull << 30)); float best = 1e9;
    for (int i = 0; i < 10; ++i) { cudaEventRecord(a); cudaMemcpyAsync(dst, buf, 1ull << 30, cudaMemcpyDeviceToDevice); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); best = std::min(best, ms); }
    printf("copy: %.0f GB/s (read+write)\n", 2.0 * (1ull << 30) / best / 1e6); cudaFree(dst); }
  struct Case { const char* name; size_t total; int tile_bytes; };
  for (Case c : {Case{"gate_up routed 69 MB, 64 KB tiles", 1056ull * 65536, 65536}, Case{"down routed 35 MB, 45 KB tiles", 768ull * 45056, 45056},
                 Case{"all experts 92 MB, 64 KB", 1408ull * 65536, 65536}, Case{"big 1 GB, 64 KB", 16384ull * 65536, 65536}}) {
    const int tiles = c.total / c.tile_bytes;
    const size_t slots = region / c.total;
    auto run = [&](auto launch) {
      for (int i = 0; i < 3; ++i) launch(buf);
      const int reps = 40;
      cudaEventRecord(a);
      for (int i = 0; i < reps; ++i) launch(buf + (i % slots) * c.total);
      cudaEventRecord(b); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
      float ms; cudaEventElapsedTime(&ms, a, b);
      return c.total * reps / (ms * 1e6);  // GB/s
    };
    const int chunks = c.tile_bytes / 16;
    double reg = run([&](char* w) { RegKernel<16><<<2 * sms, 256>>>((const uint4*)w, tiles, chunks, out); });
    printf("%-36s regs 2x64KB/SM: %6.0f GB/s", c.name, reg);
    {
      CK(cudaFuncSetAttribute(BulkKernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * c.tile_bytes));
      CK(cudaFuncSetAttribute(BulkKernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * c.tile_bytes));
      double b2 = run([&](char* w) { BulkKernel<2><<<sms, 256, 2 * c.tile_bytes>>>(w, tiles, c.tile_bytes, out); });
      double b3 = run([&](char* w) { BulkKernel<3><<<sms, 256, 3 * c.tile_bytes>>>(w, tiles, c.tile_bytes, out); });
      printf("  bulk 2 stages: %6.0f  3 stages: %6.0f GB/s\n", b2, b3);
    }
  }
  // half tiles: 32 KB stages, 6 in flight
  return 0;
}
