// Gathers of results split over the ranks of a replica (docs/parallel.md): the columns of
// a product whose weight rows are split (the LM head's vocabulary, a dense MLP's
// intermediate and output features), and the row blocks of a batch whose rows the ranks
// share out. Every value stays the one a rank computed: bitwise the one-rank result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/parallel_layout.h"
#include "engine/parallel/collectives.h"

namespace tandem {

// Every rank holds local[rows][split.chunk], its columns [split.begin(rank), end(rank))
// first (the rest padding); out[rows][out_stride] receives all split.rows columns on every
// rank. `scratch` is reused between calls. Errors: the group's.
absl::Status GatherColumns(parallel::Collectives& group, const RowSplit& split, const float* local, int64_t rows,
                           float* out, int64_t out_stride, std::vector<float>& scratch);

// The rows of a batch shared out in equal blocks: rank r owns rows [RowBlockBegin(r),
// RowBlockBegin(r + 1)).
inline int64_t RowBlock(int64_t rows, int world) { return (rows + world - 1) / world; }
inline int64_t RowBlockBegin(int64_t rows, int world, int r) { return std::min(rows, r * RowBlock(rows, world)); }

// Every rank holds its block of a [rows][width] result in local (its rows only); out
// receives all rows on every rank. Errors: the group's.
absl::Status GatherRowBlocks(parallel::Collectives& group, const float* local, int64_t rows, int64_t width,
                             float* out, std::vector<float>& scratch);

}  // namespace tandem
