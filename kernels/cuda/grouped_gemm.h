// Grouped bf16 GEMM with fp32 accumulation for the MoE experts (and skinny dense layers):
//
//   C[p][n] = sum_k A[a_row(p)][k] * B[g(p)][n][k]
//
// for the rows p of each group g: rows [group_offsets[g], group_offsets[g + 1]) use group
// g's weight matrix B[g] ([n][k] row-major, torch Linear layout), A's rows optionally
// gathered through a_rows (token rows of the permuted MoE order, moe_permute.h). Without
// group_offsets there is one group of num_rows rows (a dense layer). Only the groups in
// active_groups[0 .. *num_active) run, read on the device, so a whole MoE layer is one
// launch that a CUDA graph can capture whatever the routing.
//
// Epilogues: store fp32 or bf16; accumulate into fp32 (a residual stream); SiLU-and-mul
// for gate_up weights stored interleaved in blocks of 8 rows (8 gate rows, then the 8 up
// rows of the same intermediate indices: output column i = silu(gate_i) * up_i, n / 2
// columns); scatter-add into fp32 rows out_rows[p] scaled by row_scale[p] (the MoE
// combine). Split-K over grid.z (accumulating epilogues only, with fp32 atomics).
//
// Split activations: with a_lo (A's rounding remainder, a - bf16(a), in bf16, same layout)
// the product uses A = a + a_lo, about 16 bits of mantissa instead of 8, at the cost of a
// second tensor-core product per tile and no extra weight traffic: near-float32 accuracy
// where the GEMM is memory-bound anyway (decode). The SiLU-and-mul epilogue can emit its
// output split the same way (out_lo).
//
// Tensor cores through mma.sync m16n8k16, 64-column tiles, a 4- to 6-stage cp.async pipeline;
// memory-bound on B at decode sizes. Rows of a group are processed in chunks of 16, 32 or
// 64 (rows_hint); m_chunks spreads a group's chunks over grid.z (groups with many more
// rows than others, e.g. shared experts, then do not serialize the launch). Needs k and n
// multiples of 8 (16 for SiLU-and-mul), 16-byte aligned A/B rows. No allocation inside.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

enum class GemmEpilogue { kStoreF32, kStoreBf16, kAccumulateF32, kSiluMulBf16, kScatterAddF32 };

struct GroupedGemmParams {
  const __nv_bfloat16* a = nullptr;  // [rows][lda]
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;  // optional [total rows]: A row of each output row
  const __nv_bfloat16* a_lo = nullptr;  // optional: A's remainder, same layout as a
  const __nv_bfloat16* b = nullptr;  // [groups][n][k]
  int64_t b_group_stride = 0;        // elements between groups' matrices
  int n = 0;
  int k = 0;
  // Groups (see above). Null group_offsets: one group of num_rows rows.
  const int32_t* group_offsets = nullptr;  // [num_groups + 1]
  const int32_t* active_groups = nullptr;  // optional [max_active]
  const int32_t* num_active = nullptr;     // with active_groups: device scalar
  // Optional work list instead (moe_permute.h): block y runs tile y < *num_tiles, rows
  // [tile_row[y], tile_row[y] + tile rows) of group tile_group[y], tile rows = the row
  // tile this launch picks from rows_hint (16, 32 or 64; the permutation must use it).
  const int32_t* tile_group = nullptr;
  const int32_t* tile_row = nullptr;
  const int32_t* num_tiles = nullptr;
  int num_groups = 1;
  int num_rows = 0;    // without group_offsets
  int max_active = 0;  // grid rows: groups that may be active, or tiles (0: num_groups)
  int rows_hint = 64;  // expected rows per group: picks the row tile (16, 32 or 64)
  GemmEpilogue epilogue = GemmEpilogue::kStoreF32;
  void* out = nullptr;  // float or __nv_bfloat16 [rows][ldo] (scatter: [tokens][ldo])
  int64_t ldo = 0;
  __nv_bfloat16* out_lo = nullptr;  // kSiluMulBf16: optional remainder of the output, [rows][ldo]
  const int32_t* out_rows = nullptr;  // kScatterAddF32: destination row of each row
  const float* row_scale = nullptr;   // kScatterAddF32: scale of each row (null: 1)
  int split_k = 1;
  int m_chunks = 1;  // grid.z spreads row chunks (with split_k 1)
};

cudaError_t GroupedGemm(const GroupedGemmParams& p, cudaStream_t stream);

}  // namespace tandem::cuda
