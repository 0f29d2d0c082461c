#include "kernels/cuda/moe_routing.h"

#include "kernels/cuda/moe_routing.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void MoeRoutingKernel(MoeRoutingParams p) {
  extern __shared__ float smem[];
  internal::WaitAndTrigger();
  const int warp = threadIdx.x / 32;
  const int t = blockIdx.x * kWarps + warp;
  if (t >= p.num_tokens) return;
  internal::RouteTokenWarp(p, t, p.logits + static_cast<int64_t>(t) * p.logits_stride,
                           smem + warp * internal::RouteScratchFloats(p.num_experts));
}

}  // namespace

cudaError_t MoeRouting(const MoeRoutingParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.logits == nullptr || p.expert_ids == nullptr || p.weights == nullptr || p.num_tokens < 0 ||
      p.num_experts <= 0 || p.num_experts > 1024 || p.logits_stride < p.num_experts || p.num_groups <= 0 ||
      p.num_groups > 32 || p.num_experts % p.num_groups != 0 || p.topk_groups <= 0 ||
      p.topk_groups > p.num_groups || p.top_k <= 0 || p.top_k > 32 || p.top_k > p.num_experts) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = static_cast<size_t>(kWarps) * internal::RouteScratchFloats(p.num_experts) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kWarps - 1) / kWarps);
  return internal::Launch(MoeRoutingKernel, dim3(blocks), dim3(kWarps * 32), smem, stream, p);
}

}  // namespace tandem::cuda
