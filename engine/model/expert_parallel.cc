#include "engine/model/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"

namespace tandem {

absl::Status ExpertParallelMoe::Exchange(const std::vector<std::span<const std::byte>>& send,
                                         std::vector<std::byte>& recv, std::vector<size_t>& recv_sizes) {
  recv_sizes.assign(send.size(), 0);
  for (;;) {
    absl::Status s = group_.AllToAll(send, recv, recv_sizes);
    if (!absl::IsResourceExhausted(s)) return s;
    // Every rank got the same verdict and calls again; those whose buffer was large
    // enough keep it.
    size_t need = 0;
    for (size_t n : recv_sizes) need += n;
    if (need > recv.size()) recv.resize(need);
  }
}

absl::Status ExpertParallelMoe::Run(const RoutedRows& in, const ExpertFn& run_expert, float* out) {
  const int world = group_.world_size();
  const int64_t hidden = in.hidden;
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  const size_t record = sizeof(int32_t) + row_bytes;  // dispatch record: expert id, then the row

  // Dispatch: one record per (row, chosen expert) to the expert's rank, rows in order;
  // where each went (rank, index among the records sent there) for the combine.
  dispatch_.resize(static_cast<size_t>(world));
  for (auto& d : dispatch_) d.clear();
  std::vector<int64_t> sent(static_cast<size_t>(world), 0);
  std::vector<std::pair<int, int64_t>> slot(static_cast<size_t>(in.rows * in.top_k));
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t k = 0; k < in.top_k; ++k) {
      const int32_t e = in.expert_ids[r * in.top_k + k];
      const int d = layout_.ExpertOwner(e, num_experts_);
      slot[r * in.top_k + k] = {d, sent[d]++};
      std::vector<std::byte>& buf = dispatch_[d];
      const size_t at = buf.size();
      buf.resize(at + record);
      std::memcpy(&buf[at], &e, sizeof(e));
      std::memcpy(&buf[at + sizeof(e)], in.x + r * hidden, row_bytes);
    }
  }
  std::vector<std::span<const std::byte>> send(dispatch_.begin(), dispatch_.end());
  RETURN_IF_ERROR(Exchange(send, received_, received_sizes_));

  // Run each local expert once over the rows it received, in arrival order: source rank,
  // then row, which is batch order when the ranks' rows are.
  size_t received_bytes = 0;
  for (size_t n : received_sizes_) received_bytes += n;
  const int64_t records = static_cast<int64_t>(received_bytes / record);
  const auto [first, last] = layout_.LocalExperts(num_experts_);
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(last - first));
  for (int64_t i = 0; i < records; ++i) {
    int32_t e;
    std::memcpy(&e, &received_[i * record], sizeof(e));
    if (e < first || e >= last) {
      return absl::InternalError(absl::StrCat("rank ", group_.rank(), " received a row for expert ", e,
                                              ", which it does not hold"));
    }
    rows_of[e - first].push_back(i);
  }
  replies_.resize(static_cast<size_t>(records * hidden));
  for (int64_t e = first; e < last; ++e) {
    const std::vector<int64_t>& idx = rows_of[e - first];
    if (idx.empty()) continue;
    const int64_t n = static_cast<int64_t>(idx.size());
    xs_.resize(static_cast<size_t>(n * hidden));
    ys_.resize(static_cast<size_t>(n * hidden));
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(&xs_[j * hidden], &received_[idx[j] * record + sizeof(int32_t)], row_bytes);
    }
    run_expert(e, xs_.data(), n, ys_.data());
    for (int64_t j = 0; j < n; ++j) std::memcpy(&replies_[idx[j] * hidden], &ys_[j * hidden], row_bytes);
  }

  // Combine: each source gets its records' outputs back, in the order it sent them.
  std::vector<std::span<const std::byte>> replies(static_cast<size_t>(world));
  size_t offset = 0;
  for (int s = 0; s < world; ++s) {
    const size_t n = received_sizes_[s] / record * row_bytes;
    replies[s] = std::as_bytes(std::span<const float>(replies_)).subspan(offset, n);
    offset += n;
  }
  size_t expected = 0;
  for (int64_t n : sent) expected += static_cast<size_t>(n) * row_bytes;
  combined_.resize(expected);
  RETURN_IF_ERROR(Exchange(replies, combined_, combined_sizes_));
  std::vector<int64_t> first_record(static_cast<size_t>(world), 0);
  for (int d = 1; d < world; ++d) first_record[d] = first_record[d - 1] + sent[d - 1];

  // Each row's outputs summed in expert-id order, from zero, like the one-rank loop.
  std::vector<int64_t> order(static_cast<size_t>(in.top_k));
  std::vector<float> output(static_cast<size_t>(hidden));
  for (int64_t r = 0; r < in.rows; ++r) {
    const int32_t* ids = in.expert_ids + r * in.top_k;
    for (int64_t k = 0; k < in.top_k; ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    float* dst = out + r * hidden;
    std::fill(dst, dst + hidden, 0.0f);
    for (int64_t k : order) {
      const auto [d, i] = slot[r * in.top_k + k];
      std::memcpy(output.data(), &combined_[(first_record[d] + i) * row_bytes], row_bytes);
      AddWeightedExpertOutput(dst, output.data(), in.weights[r * in.top_k + k], hidden);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
