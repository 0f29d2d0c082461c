// Token permutation for the MoE layers on the GPU (docs/design.md §8).
//
// MoePermute sorts the (token, expert) pairs of a routing by expert: group g's rows are
// [group_offsets[g], group_offsets[g + 1]) of the permuted order, tokens ascending inside
// a group (stable, so results never depend on thread timing). Shared experts can ride
// along as groups num_experts .. num_experts + num_shared - 1 that every token uses with
// weight 1, so that one grouped GEMM runs routed and shared experts together. The active
// groups (with at least one row) are listed for the grouped GEMM's grid, and optionally
// its work list: every group's rows cut into tiles of tile_rows (group, first row), so
// that a grouped GEMM gives each tile one thread block whatever the groups' sizes. One
// block (many, with scratch, for many pairs); no host synchronization, so it can be
// captured in a CUDA graph.
//
// GatherRows copies rows of a bf16 matrix in permuted order (for GEMM libraries that need
// contiguous rows); MoeCombine adds the weighted expert outputs back to the tokens.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/moe_routing.h"

namespace tandem::cuda {

inline constexpr int kMoeMaxGroups = 1024;

struct MoePermuteParams {
  const int32_t* expert_ids = nullptr;  // [num_tokens][top_k]
  const float* weights = nullptr;       // [num_tokens][top_k]
  int num_tokens = 0;
  int top_k = 0;
  int num_experts = 0;
  int num_shared = 0;  // groups appended after the routed experts, weight 1 for every token
  // Outputs; G = num_experts + num_shared (at most kMoeMaxGroups), E = top_k + num_shared.
  int32_t* group_offsets = nullptr;  // [G + 1]
  int32_t* active_groups = nullptr;  // [G], ascending; entries past *num_active unspecified
  int32_t* num_active = nullptr;     // [1]
  int32_t* sorted_token = nullptr;   // [num_tokens * E]: token of each permuted row
  float* sorted_weight = nullptr;    // [num_tokens * E]: its routing weight
  int32_t* entry_row = nullptr;      // [num_tokens][E]: permuted row of each pair (routed first)
  // Optional work list, with tile_rows > 0: at most MoeMaxTiles(...) tiles.
  int tile_rows = 0;
  int32_t* tile_group = nullptr;  // group of each tile
  int32_t* tile_row = nullptr;    // first permuted row of each tile
  int32_t* num_tiles = nullptr;   // [1]
  // Optional device scratch of MoePermuteScratchInts(G) ints: with it, permutations of more
  // than kMoePermuteOneBlockPairs pairs (prefill chunks) run on kMoePermuteBlocks blocks in
  // three launches instead of one block.
  int32_t* scratch = nullptr;
};

inline constexpr int kMoePermuteBlocks = 64;
inline constexpr int64_t kMoePermuteOneBlockPairs = 16384;
inline int64_t MoePermuteScratchInts(int groups) { return static_cast<int64_t>(kMoePermuteBlocks) * groups; }

// An upper bound of the tiles of a permutation of `rows` rows over `groups` groups.
inline int MoeMaxTiles(int64_t rows, int groups, int tile_rows) {
  return static_cast<int>(rows / tile_rows + groups);
}

cudaError_t MoePermute(const MoePermuteParams& p, cudaStream_t stream);

// The MoE front end of a decode step of a few tokens in one launch: the post-attention
// RMSNorm of the residual rows x (RmsNorm's arithmetic), the float32 router product, the
// routing (MoeRouting) and the permutation (MoePermute). Blocks of 256 threads each
// compute 4 experts' logits for every token, their router rows loaded before waiting for
// the previous kernel (programmatic dependent launch, launch_control.h); the last block to
// finish (a device counter, zero before the first launch and left at zero) routes and
// permutes. Block 0 also stores the normalized rows in bf16 (and, with h_lo, their
// remainder) for the expert GEMMs. routing.logits is ignored; permute must name the
// routing's expert_ids and weights. hidden a multiple of 32. Shapes outside
// MoeFusedRouteSupports are refused (MoeRouting + MoePermute take any).
inline constexpr int kMoeFusedMaxTokens = 4;

struct MoeFusedRouteParams {
  const float* x = nullptr;  // [num_tokens][x_stride]
  int64_t x_stride = 0;
  const float* norm_weight = nullptr;  // [hidden]
  float norm_eps = 1e-6f;
  int hidden = 0;
  const float* router = nullptr;  // [num_experts][hidden]
  __nv_bfloat16* h_bf16 = nullptr;  // [num_tokens][h_stride]
  __nv_bfloat16* h_lo = nullptr;    // optional, same layout
  int64_t h_stride = 0;
  float* router_logits = nullptr;  // [num_tokens][num_experts] scratch
  uint32_t* counter = nullptr;
  MoeRoutingParams routing;  // num_tokens <= kMoeFusedMaxTokens
  MoePermuteParams permute;
};

bool MoeFusedRouteSupports(int num_tokens, int num_experts, int top_k, int num_shared, int tile_rows);
cudaError_t MoeFusedRoute(const MoeFusedRouteParams& p, cudaStream_t stream);

struct GatherRowsParams {
  const __nv_bfloat16* src = nullptr;  // [*][src_stride]
  int64_t src_stride = 0;
  const int32_t* rows = nullptr;  // [num_rows] source row of each output row
  int64_t num_rows = 0;
  int64_t cols = 0;  // a multiple of 8, strides too (16-byte vectors)
  __nv_bfloat16* dst = nullptr;  // [num_rows][dst_stride]
  int64_t dst_stride = 0;
};

cudaError_t GatherRows(const GatherRowsParams& p, cudaStream_t stream);

struct MoeCombineParams {
  const float* y = nullptr;  // [permuted rows][y_stride]: expert outputs
  int64_t y_stride = 0;
  const int32_t* entry_row = nullptr;     // [num_tokens][entries_per_token]
  const float* sorted_weight = nullptr;  // weight of each permuted row
  int num_tokens = 0;
  int entries_per_token = 0;
  int64_t dim = 0;
  float* out = nullptr;  // [num_tokens][out_stride]: out += sum_j weight_j * y[row_j]
  int64_t out_stride = 0;
};

cudaError_t MoeCombine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
