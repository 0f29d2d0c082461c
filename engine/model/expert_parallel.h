// Expert parallelism for a MoE layer's routed experts (docs/parallel.md): each rank holds
// a range of experts (ParallelLayout::LocalExperts); after routing, every token row goes
// to the ranks holding its chosen experts (all-to-all dispatch), each rank runs its
// experts over the rows it received, and the outputs go back to the rows' ranks (all-to-
// all combine), which add each row's expert outputs in expert-id order, the order of the
// one-rank loop (DeepseekModel::Moe). An expert sees its rows in (source rank, row) order,
// so with the ranks' rows in batch order it runs exactly the one-rank rows; each output is
// a dot product of one row, whatever the others. Hence bitwise the one-rank result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/parallel_layout.h"
#include "engine/parallel/collectives.h"

namespace tandem {

// dst[i] += src[i] * weight: a routed expert's output added into a row's sum. The one
// expression both the one-rank loop and the combine use, so that both round alike
// (fused or not, the compiler treats the same expression the same way).
inline void AddWeightedExpertOutput(float* dst, const float* src, float weight, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i] * weight;
}

// This rank's rows of one MoE layer after routing.
struct RoutedRows {
  const float* x = nullptr;  // [rows][hidden], the layer's normalized input
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t top_k = 0;
  const int32_t* expert_ids = nullptr;  // [rows][top_k]
  const float* weights = nullptr;       // [rows][top_k]
};

// Runs routed expert `expert` (one of this rank's) over rows x[n][hidden] into y[n][hidden].
using ExpertFn = std::function<void(int64_t expert, const float* x, int64_t n, float* y)>;

class ExpertParallelMoe {
 public:
  // `group` is used by the calls below, collectively: every rank calls Run for every MoE
  // layer of every step, with its own rows (zero included).
  ExpertParallelMoe(parallel::Collectives& group, const ParallelLayout& layout, int64_t num_experts)
      : group_(group), layout_(layout), num_experts_(num_experts) {}

  // out[rows][hidden] = for each row, its experts' outputs times their weights, summed in
  // expert-id order starting from zero. Errors: the group's (the group is then unusable).
  absl::Status Run(const RoutedRows& in, const ExpertFn& run_expert, float* out);

 private:
  // One AllToAll, growing `recv` and retrying when some rank's buffer is too small.
  absl::Status Exchange(const std::vector<std::span<const std::byte>>& send, std::vector<std::byte>& recv,
                        std::vector<size_t>& recv_sizes);

  parallel::Collectives& group_;
  ParallelLayout layout_;
  int64_t num_experts_;
  // Buffers kept across calls (their capacity).
  std::vector<std::vector<std::byte>> dispatch_;
  std::vector<std::byte> received_, combined_;
  std::vector<size_t> received_sizes_, combined_sizes_;
  std::vector<float> replies_, xs_, ys_;
};

}  // namespace tandem
