// How a DeepSeek-V2/V3 model's weights are split over the ranks of one replica
// (docs/parallel.md): which routed experts (expert parallelism) and which rows of the LM
// head and the dense MLPs (tensor parallelism) a rank holds. Every rank computes the same
// layout from the same config, so none needs to be told another's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem {

// Rows of a matrix split over `world` ranks in equal chunks of a multiple of an alignment
// (the last ranks may hold fewer rows, or none): rank r holds [begin(r), end(r)). A
// gather of per-rank results pads every rank's part to `chunk` rows.
struct RowSplit {
  int64_t rows = 0;
  int64_t chunk = 0;
  int world = 1;

  int64_t begin(int r) const { return std::min(rows, r * chunk); }
  int64_t end(int r) const { return std::min(rows, (r + 1) * chunk); }
  int64_t size(int r) const { return end(r) - begin(r); }

  static RowSplit Whole(int64_t rows) { return {.rows = rows, .chunk = rows, .world = 1}; }
  static RowSplit Make(int64_t rows, int world, int64_t align) {
    const int64_t per = (rows + world - 1) / world;
    return {.rows = rows, .chunk = (per + align - 1) / align * align, .world = world};
  }
};

// The row alignment that keeps a split matrix's products bitwise those of the whole one:
// the CPU matmul takes weight rows in blocks of kMatmulRowBlock from row 0 (a row's dot
// product is computed by the block code or the tail code, which round differently), and
// an FP8 matrix's scales cover 128-row blocks.
inline int64_t SplitAlignment(DType stored) {
  return stored == DType::kF8E4M3 ? cpu::kFp8BlockSize : cpu::kMatmulRowBlock;
}

struct ParallelLayout {
  int rank = 0;
  int world = 1;
  bool expert_parallel = false;  // routed experts split by id
  bool tensor_parallel = false;  // the LM head and the dense MLPs split by rows
  // Data-parallel attention: each rank runs the rows of its own sequences only (attention
  // over its own KV pool, the dense parts whole), and a MoE layer's expert exchange takes
  // those rows as they are, where without it every rank has the whole batch and
  // dispatches one block of it.
  bool data_parallel = false;

  bool experts_split() const { return expert_parallel && world > 1; }
  bool dense_split() const { return tensor_parallel && world > 1; }

  // Rank r holds routed experts [ExpertBegin(r), ExpertBegin(r + 1)), all of them
  // without expert parallelism.
  int64_t ExpertBegin(int r, int64_t experts) const {
    if (!experts_split()) return r <= rank ? 0 : experts;
    return static_cast<int64_t>(r) * experts / world;
  }
  std::pair<int64_t, int64_t> LocalExperts(int64_t experts) const {
    if (!experts_split()) return {0, experts};
    return {ExpertBegin(rank, experts), ExpertBegin(rank + 1, experts)};
  }
  // The rank holding routed expert `e` (under expert parallelism).
  int ExpertOwner(int64_t e, int64_t experts) const {
    return static_cast<int>(((e + 1) * world - 1) / experts);
  }
};

}  // namespace tandem
