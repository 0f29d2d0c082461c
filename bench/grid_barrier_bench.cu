// What a dependent step costs between the phases of a decode layer, three ways, measured
// in the same run (the question behind the persistent per-layer kernel planned in
// docs/performance.md):
//  - kernel boundaries: a chain of N kernels, each waiting for the previous one
//    (programmatic dependent launch, captured into a CUDA graph) and then reading what
//    another block of the previous kernel wrote — the reference, as the model runs today;
//  - grid barriers: one persistent kernel of N phases separated by a counter barrier (one
//    thread per block fences, counts and spins), the same dependent read per phase; launched
//    plainly, as a cooperative launch, and as a cooperative launch with programmatic
//    serialization, each captured into a graph — whether the runtime accepts the last
//    combination is reported, not assumed.
// Every block is one per multiprocessor (all resident). Median over --iters graph
// launches; JSON on stdout and to --json FILE.
//
//   grid_barrier_bench [--phases N] [--iters N] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One dependent step: block b reads what block b + 1 wrote in the previous step (an L2
// round trip on the critical path, as a GEMV reading the previous phase's output) and
// writes its own value for the next.
__device__ __forceinline__ void Step(const unsigned* prev, unsigned* next) {
  const int b = static_cast<int>(blockIdx.x), g = static_cast<int>(gridDim.x);
  if (threadIdx.x == 0) next[b] = __ldcg(prev + (b + 1) % g) + 1u;
}

__global__ void __launch_bounds__(kThreads, 1) ChainKernel(const unsigned* prev, unsigned* next) {
  tandem::cuda::internal::WaitAndTrigger();
  Step(prev, next);
}

// Phases separated by a barrier on a counter that only grows within a launch (target =
// phase x blocks); the counter is cleared before each launch.
__global__ void __launch_bounds__(kThreads, 1) PersistentKernel(unsigned* buf, int phases, unsigned* counter) {
  tandem::cuda::internal::GridDependencyWait();
  const unsigned g = gridDim.x;
  for (int p = 1; p <= phases; ++p) {
    Step(buf + (p - 1) * g, buf + p * g);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      while (LoadAcquire(counter) < static_cast<unsigned>(p) * g) {
      }
    }
    __syncthreads();
  }
  tandem::cuda::internal::TriggerDependentLaunch();
}

struct Graph {
  cudaGraphExec_t exec = nullptr;
  std::string error;  // why capture or instantiation failed
};

template <typename Enqueue>
Graph Capture(cudaStream_t stream, Enqueue enqueue) {
  Graph g;
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launch = enqueue();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (launch != cudaSuccess || end != cudaSuccess) {
    g.error = std::string(cudaGetErrorString(launch != cudaSuccess ? launch : end));
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return g;
  }
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    g.error = cudaGetErrorString(inst);
    cudaGetLastError();
    g.exec = nullptr;
  }
  return g;
}

// Median µs of one graph launch.
double Time(const Graph& g, cudaStream_t stream, int iters) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(g.exec, stream));
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    CHECK_CUDA(cudaGraphLaunch(g.exec, stream));
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

cudaError_t LaunchWith(const void* kernel, int blocks, cudaStream_t stream, bool cooperative, bool programmatic,
                       void** args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (cooperative) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n].val.cooperative = 1;
    ++n;
  }
  if (programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  return cudaLaunchKernelExC(&config, kernel, args);
}

}  // namespace

int main(int argc, char** argv) {
  int phases = 16, iters = 50;
  std::string json_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--phases" && i + 1 < argc) phases = std::stoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json_file = argv[++i];
    else {
      std::fprintf(stderr, "usage: grid_barrier_bench [--phases N] [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  int device = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  unsigned *buf = nullptr, *counter = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, sizeof(unsigned) * sms * (phases + 1)));
  CHECK_CUDA(cudaMalloc(&counter, sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(buf, 0, sizeof(unsigned) * sms * (phases + 1)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Reference: a chain of `phases` kernels with programmatic launch, plus one empty
  // kernel's worth as the base (a one-kernel chain).
  auto chain = [&](int n) {
    return Capture(stream, [&]() -> cudaError_t {
      for (int p = 1; p <= n; ++p) {
        const unsigned* prev = buf + (p - 1) * sms;
        unsigned* next = buf + p * sms;
        void* args[] = {&prev, &next};
        const cudaError_t e = LaunchWith(reinterpret_cast<const void*>(ChainKernel), sms, stream, false, true, args);
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    });
  };
  const Graph chain_n = chain(phases), chain_1 = chain(1);
  if (!chain_n.error.empty() || !chain_1.error.empty()) {
    std::fprintf(stderr, "kernel chain: %s%s\n", chain_n.error.c_str(), chain_1.error.c_str());
    return 1;
  }
  const double boundary_us = (Time(chain_n, stream, iters) - Time(chain_1, stream, iters)) / (phases - 1);

  struct Variant {
    const char* name;
    bool cooperative, programmatic;
  };
  const Variant variants[] = {{"plain", false, false}, {"cooperative", true, false},
                              {"cooperative + programmatic", true, true}};
  std::string rows;
  std::printf("%s, %d multiprocessors, %d blocks of %d threads\n", prop.name, sms, sms, kThreads);
  std::printf("kernel boundary (programmatic launch, graph): %.2f us per dependent step\n", boundary_us);
  for (const Variant& v : variants) {
    auto persistent = [&](int n) {
      return Capture(stream, [&]() -> cudaError_t {
        cudaError_t e = cudaMemsetAsync(counter, 0, sizeof(unsigned), stream);
        if (e != cudaSuccess) return e;
        void* args[] = {&buf, &n, &counter};
        return LaunchWith(reinterpret_cast<const void*>(PersistentKernel), sms, stream, v.cooperative,
                          v.programmatic, args);
      });
    };
    const Graph many = persistent(phases), one = persistent(1);
    std::string row = std::string("{\"launch\": \"") + v.name + "\"";
    if (!many.error.empty() || !one.error.empty()) {
      const std::string why = !many.error.empty() ? many.error : one.error;
      std::printf("grid barrier, %s: not captured (%s)\n", v.name, why.c_str());
      row += ", \"captured\": false, \"error\": \"" + why + "\"}";
    } else {
      const double barrier_us = (Time(many, stream, iters) - Time(one, stream, iters)) / (phases - 1);
      std::printf("grid barrier, %s: %.2f us per dependent step (%.2f of a kernel boundary)\n", v.name, barrier_us,
                  barrier_us / boundary_us);
      char buf2[160];
      std::snprintf(buf2, sizeof(buf2), ", \"captured\": true, \"us_per_step\": %.3f, \"ratio_to_boundary\": %.3f}",
                    barrier_us, barrier_us / boundary_us);
      row += buf2;
    }
    rows += (rows.empty() ? "" : ", ") + row;
  }
  char head[512];
  std::snprintf(head, sizeof(head),
                "{\"benchmark\": \"grid_barrier\", \"device\": \"%s\", \"blocks\": %d, \"threads\": %d, "
                "\"phases\": %d, \"kernel_boundary_us_per_step\": %.3f, \"grid_barrier\": [",
                prop.name, sms, kThreads, phases, boundary_us);
  const std::string json = std::string(head) + rows + "]}\n";
  std::fputs(json.c_str(), stdout);
  if (!json_file.empty()) {
    FILE* f = std::fopen(json_file.c_str(), "w");
    if (f != nullptr) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
