// The MoE expert projections of a decode step of a few tokens as matrix-vector products
// (memory-bound on the expert weights): the grouped GEMM's contract (grouped_gemm.h) for
// groups of 1 .. kMoeExpertGemvMaxRows rows, with its two MoE epilogues,
//
//   kSiluMulBf16:   out[p][i] = silu(gate_i) * up_i of  sum_k A[a_row(p)][k] * B[g(p)][.][k]
//                   (gate_up weights interleaved in blocks of 8 rows, n / 2 output columns,
//                   bf16 value and optionally its remainder out_lo)
//   kScatterAddF32: out[out_rows[p]][c] += row_scale[p] * sum_k A[p][k] * B[g(p)][c][k]
//                   (fp32 atomics: the down projection added into the residual stream)
//
// for the rows p of every active group g (rows [group_offsets[g], group_offsets[g + 1]) of
// the permuted order, moe_permute.h). A is bf16, optionally with its remainder a_lo (split
// activations): the kernel multiplies float32 a + a_lo by the bf16 weights with float32
// accumulation, as the grouped GEMM's two tensor-core products do.
//
// Work: each group's n weight rows are cut into tiles of 16 rows (the 8 gate + 8 up rows of
// one interleave block); a block of 8 warps takes one tile at a time, each warp two weight
// rows over all of k with every 16-byte weight load of a 2048-element pass in flight
// before the first use (registers; no shared-memory staging of weights, no split-K), the
// next tile's loads issued before the current tile's reduction. The block's tiles are
// block, block + grid, ... of the list ordered static groups first, then the routed active
// groups (active_groups without the static ones). The A rows are staged in shared memory
// as float32: the rows of the tile's group (again only when the group changes), with
// staged_rows every group's rows once, right after the wait, or with a_row_count all A
// rows once, right after the wait: then every group's products are computed for all of
// them and stored for the rows the group has (the gate_up projection of a few tokens: its
// first products need nothing from the routing but the weights and the tokens, one round
// trip after the wait).
//
// Static groups: the last num_static groups (the shared experts), which every token uses:
// their weights do not depend on the routing, so with programmatic dependent launch
// (launch_control.h) each block issues the loads of its first tile, if static, before
// waiting for the previous kernel (the routing). They must have rows (at most max_rows,
// like every group); routed groups may not be static. Nothing but weights is read before
// the wait.
//
// Early static tiles (norm_x set; the gate_up projection with a_row_count): each block
// computes its static groups' tiles before the wait, from the residual rows norm_x that
// it normalizes itself with MoeFusedRoute's arithmetic (the same bits as that kernel's
// h_bf16 + h_lo, which are then not read), so the shared experts' products overlap the
// routing instead of waiting for it. Only for a launch whose previous kernel waits before
// it lets this one start (MoeFusedRoute does: norm_x is then complete), with the static
// groups' rows where MoePermute puts them: group num_groups - num_static + s at rows
// static_begin + s * a_row_count + m for token m (checked after the wait: a mismatch traps).
//
// Needs n a multiple of 16, k and lda multiples of 8, 16-byte aligned A and B rows;
// kScatterAddF32: ldo even and out 8-byte aligned. No allocation; graph-capturable.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/grouped_gemm.h"

namespace tandem::cuda {

inline constexpr int kMoeExpertGemvMaxRows = 4;     // rows of one group
inline constexpr int kMoeExpertGemvMaxActive = 64;  // active groups, static ones included

struct MoeExpertGemvParams {
  const __nv_bfloat16* a = nullptr;     // [*][lda]
  const __nv_bfloat16* a_lo = nullptr;  // optional: A's remainder, same layout
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;  // optional [rows]: A row of each permuted row (else the row itself)
  // With a_rows: 0, or the number of A rows (at most max_rows) when every a_rows value is
  // below it and a group's rows have distinct ones (the tokens of a step): see above.
  int a_row_count = 0;
  // Without a_rows: 0, or the number of permuted rows (group_offsets[num_groups], every
  // group's rows), to stage them all once right after the wait instead of each group's
  // when its first tile comes (ignored where they would not fit two blocks per SM).
  int staged_rows = 0;
  const __nv_bfloat16* b = nullptr;  // [num_groups][n][k]
  int64_t b_group_stride = 0;        // elements between groups' matrices
  // Instead of b: FP8 E4M3 codes [num_groups][n][k] (b_group_stride elements = bytes apart,
  // 8-byte aligned rows), each multiplied by its row's scale for its 128 columns,
  // b_row_scales [num_groups][n][ceil(k / 128)] (a checkpoint's 128 x 128 block scales
  // expanded to rows, so that interleaved gate/up rows keep theirs). A chunk's 8 products
  // are summed, then scaled once. FP8 tiles are 32 rows: n a multiple of 32.
  const uint8_t* b_fp8 = nullptr;
  const float* b_row_scales = nullptr;
  int n = 0;
  int k = 0;
  const int32_t* group_offsets = nullptr;  // [num_groups + 1]
  const int32_t* active_groups = nullptr;  // [max_active] readable; ascending up to *num_active
  const int32_t* num_active = nullptr;     // device scalar
  int num_groups = 0;
  int num_static = 0;  // the last num_static groups: always active, weights streamed before the wait
  int max_active = 0;  // bound of *num_active (sizes the grid), 1 .. kMoeExpertGemvMaxActive
  int max_rows = 1;    // bound of any group's rows, 1 .. kMoeExpertGemvMaxRows
  GemmEpilogue epilogue = GemmEpilogue::kSiluMulBf16;  // or kScatterAddF32
  void* out = nullptr;  // kSiluMulBf16: __nv_bfloat16 [rows][ldo]; kScatterAddF32: float [tokens][ldo]
  int64_t ldo = 0;
  __nv_bfloat16* out_lo = nullptr;    // kSiluMulBf16: optional remainder of the output
  const int32_t* out_rows = nullptr;  // kScatterAddF32: destination row of each row (null: the row)
  const float* row_scale = nullptr;   // kScatterAddF32: scale of each row (null: 1)
  // Optional, kScatterAddF32: the sums in a fixed order (the same result on every run)
  // instead of float32 atomics in block-completion order. Each (group, column tile) stores
  // its scaled rows into `partial` (plain stores at its permuted rows), and the last block to
  // finish a column tile (tile_counters[tile], n / 16 words: zero before the first launch,
  // left at zero) adds that tile's rows into out, permuted rows ascending (so a token's
  // groups in ascending order), once it has done its other tiles. Refused
  // (cudaErrorInvalidValue) where a block would take more than 128 (group, tile) pairs.
  float* partial = nullptr;            // [permuted rows][ldo]
  uint32_t* tile_counters = nullptr;   // [n / 16]
  int out_row_count = 0;               // rows of out (the tokens), 1 .. 64, with partial
  // Optional, kSiluMulBf16 with a_row_count: early static tiles (above). A must then be
  // those rows' RMSNorm (norm_weight, norm_eps) in bf16 (+ a_lo), as MoeFusedRoute stores it.
  const float* norm_x = nullptr;  // [a_row_count][norm_x_stride] float32, k columns
  int64_t norm_x_stride = 0;
  const float* norm_weight = nullptr;  // [k]
  float norm_eps = 0.0f;
  int static_begin = 0;  // first permuted row of the static groups (tokens x routed top-k)
};

// Whether shapes of these sizes are supported (the launcher checks the rest).
inline bool MoeExpertGemvSupports(int n, int k, int max_rows, int max_active, int num_static) {
  return n > 0 && n % 16 == 0 && k > 0 && k % 8 == 0 && max_rows >= 1 && max_rows <= kMoeExpertGemvMaxRows &&
         max_active >= 1 && max_active <= kMoeExpertGemvMaxActive && num_static >= 0 && num_static <= max_active &&
         static_cast<int64_t>(kMoeExpertGemvMaxRows) * k * 4 <= 200 * 1024;
}

cudaError_t MoeExpertGemv(const MoeExpertGemvParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
