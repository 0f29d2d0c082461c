#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <span>

namespace tandem {

absl::Status GatherColumns(parallel::Collectives& group, const RowSplit& split, const float* local, int64_t rows,
                           float* out, int64_t out_stride, std::vector<float>& scratch) {
  const int world = group.world_size();
  const size_t block = static_cast<size_t>(rows * split.chunk);
  scratch.resize(block * world);
  absl::Status s = group.AllGather(std::as_bytes(std::span<const float>(local, block)),
                                   std::as_writable_bytes(std::span<float>(scratch)));
  if (!s.ok()) return s;
  for (int r = 0; r < world; ++r) {
    const int64_t begin = split.begin(r), n = split.size(r);
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = &scratch[r * block + i * split.chunk];
      std::copy(src, src + n, out + i * out_stride + begin);
    }
  }
  return absl::OkStatus();
}

absl::Status GatherRowBlocks(parallel::Collectives& group, const float* local, int64_t rows, int64_t width,
                             float* out, std::vector<float>& scratch) {
  const int world = group.world_size();
  const int64_t block_rows = RowBlock(rows, world);
  const int64_t mine = RowBlockBegin(rows, world, group.rank() + 1) - RowBlockBegin(rows, world, group.rank());
  const size_t block = static_cast<size_t>(block_rows * width);
  // Rank r's block lands at rows [r block_rows, ...): the gathered buffer is the batch.
  scratch.assign(block * (world + 1), 0.0f);
  std::copy(local, local + mine * width, scratch.begin());
  absl::Status s = group.AllGather(std::as_bytes(std::span<const float>(scratch.data(), block)),
                                   std::as_writable_bytes(std::span<float>(scratch).subspan(block)));
  if (!s.ok()) return s;
  std::copy(scratch.begin() + block, scratch.begin() + block + rows * width, out);
  return absl::OkStatus();
}

}  // namespace tandem
