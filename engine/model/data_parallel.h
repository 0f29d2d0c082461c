// Data-parallel attention over the ranks of one replica (docs/parallel.md): each sequence
// lives on one rank (ForwardSequence::dp_rank), whose KV pool holds its blocks; every rank
// gets the whole step's batch, runs the model over its own sequences only (embedding,
// attention over its own pool, the dense and shared-expert parts, its rows through the
// MoE layers' expert exchange when the experts are split too), and the logits come back to
// rank 0 in batch order. Each logit is computed from one row by the same kernels as on one
// rank (the CPU kernels compute every row by itself, whatever rows run with it), so rank
// 0's logits are bitwise those of one rank running the whole batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/forward_batch.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/parallel/collectives.h"

namespace tandem {

// The rows of logits a Forward returns for `s`.
inline int64_t LogitRows(const ForwardSequence& s) {
  if (s.no_logits) return 0;
  return s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
}

// One step on this rank of a group whose model was loaded with LoadOptions::data_parallel:
// every rank calls it with the same `batch` (the sequences of every rank, each with its
// dp_rank; a rank may have none) and its own `cache`, which the block tables of its own
// sequences index. Rank 0 gets the logits of the whole batch, [rows][vocab] in batch order
// as DeepseekModel::Forward returns them; the other ranks an empty vector. Every rank
// takes part in every collective, whatever its row count.
// Errors: INVALID_ARGUMENT for a dp_rank outside the group; Forward's checks of a rank's
// sequences, agreed on by every rank before any computes (the rank at fault returns its
// error, the others the same code naming that rank), so that a bad step fails everywhere
// and leaves the group usable; the group's errors (after which it is unusable).
absl::StatusOr<std::vector<float>> ForwardDataParallel(parallel::Collectives& group, DeepseekModel& model,
                                                       std::span<const ForwardSequence> batch,
                                                       LatentKvCache& cache,
                                                       const DeepseekForwardOptions& options = {});

}  // namespace tandem
