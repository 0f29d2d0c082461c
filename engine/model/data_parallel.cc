#include "engine/model/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"

namespace tandem {
namespace {

// Every rank's verdict on its own sequences, so that all go on or all stop: a rank that
// stopped alone would leave the others waiting in the pass's first collective.
absl::Status AgreeOnBatch(parallel::Collectives& group, const absl::Status& mine) {
  const int world = group.world_size();
  const int32_t code = static_cast<int32_t>(mine.code());
  std::vector<int32_t> codes(static_cast<size_t>(world));
  RETURN_IF_ERROR(group.AllGather(std::as_bytes(std::span<const int32_t>(&code, 1)),
                                  std::as_writable_bytes(std::span<int32_t>(codes))));
  if (!mine.ok()) return mine;
  for (int r = 0; r < world; ++r) {
    if (codes[r] != 0) {
      return absl::Status(static_cast<absl::StatusCode>(codes[r]),
                          absl::StrCat("rank ", r, "'s sequences of this step were refused (see its error)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> ForwardDataParallel(parallel::Collectives& group, DeepseekModel& model,
                                                       std::span<const ForwardSequence> batch,
                                                       LatentKvCache& cache, const DeepseekForwardOptions& options) {
  const int rank = group.rank(), world = group.world_size();
  // (Every rank has the same batch: each refuses it alike, before any collective.)
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].dp_rank < 0 || batch[i].dp_rank >= world) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " is on data-parallel rank ", batch[i].dp_rank,
                                                     " of a group of ", world));
    }
  }
  std::vector<ForwardSequence> mine;
  for (const ForwardSequence& s : batch) {
    if (s.dp_rank == rank) mine.push_back(s);
  }
  RETURN_IF_ERROR(AgreeOnBatch(group, model.CheckBatch(mine, cache)));
  ASSIGN_OR_RETURN(std::vector<float> logits, model.Forward(mine, cache, options));

  // Every rank's logits to rank 0 (an exchange in which only rank 0 receives), packed by
  // source rank, each rank's rows in its batch order.
  const int64_t vocab = model.config().vocab_size;
  const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
  int64_t total_rows = 0;
  for (const ForwardSequence& s : batch) total_rows += LogitRows(s);
  std::vector<std::span<const std::byte>> send(static_cast<size_t>(world));
  send[0] = std::as_bytes(std::span<const float>(logits));
  std::vector<float> received(rank == 0 ? static_cast<size_t>(total_rows * vocab) : 0);
  std::vector<size_t> sizes(static_cast<size_t>(world));
  RETURN_IF_ERROR(group.AllToAll(send, std::as_writable_bytes(std::span<float>(received)), sizes));
  if (rank != 0) return std::vector<float>();
  size_t got = 0;
  for (size_t n : sizes) got += n;
  if (got != received.size() * sizeof(float)) {
    return absl::InternalError(absl::StrCat("the ranks sent ", got, " bytes of logits for ", total_rows, " rows"));
  }

  // Back into batch order: each sequence's rows come next from its rank's block.
  std::vector<size_t> next(static_cast<size_t>(world), 0);  // byte offset of each rank's next row
  for (int r = 1; r < world; ++r) next[r] = next[r - 1] + sizes[r - 1];
  std::vector<float> out(received.size());
  std::byte* const from = reinterpret_cast<std::byte*>(received.data());
  std::byte* to = reinterpret_cast<std::byte*>(out.data());
  for (const ForwardSequence& s : batch) {
    const size_t n = static_cast<size_t>(LogitRows(s)) * row_bytes;
    if (n == 0) continue;  // (a step without logits has no buffers: memcpy takes no null)
    std::memcpy(to, from + next[s.dp_rank], n);
    next[s.dp_rank] += n;
    to += n;
  }
  return out;
}

}  // namespace tandem
