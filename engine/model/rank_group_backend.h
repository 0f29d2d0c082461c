// A replica whose ranks are processes of this machine running the CPU model together
// (docs/parallel.md): rank 0, this process, is the engine's backend; each Forward
// broadcasts the step's plan (rank_step.h) and then runs rank 0's part, while ranks 1..W-1
// run their part of the same step from the plan (RunFollowerRank). Without data
// parallelism every rank runs the whole batch; with it (--data-parallel W) each rank runs
// only the sequences it holds (ForwardSequence::dp_rank), in its range of the pool's
// blocks, and the logits are gathered to rank 0 (data_parallel.h).
// The routed experts and/or the LM head and dense MLPs are split (DeepseekModel::
// LoadOptions). The logits are bitwise one rank's.
//
// The engine's host pool is memory every rank maps (shared_host_pool(), mapped before the
// ranks are forked): each rank computes into the blocks of its own sequences there (with
// data parallelism rank r's range of block ids; without, every rank writes the same bits
// into the same blocks), so KV that comes in from outside the replica by block ids (a
// prefill replica's transfer, the kvstore tier) is every rank's, and KV read out by block
// ids is whichever rank's computed it. On the CPU backend only: a GPU rank's pool is its
// GPU's (docs/parallel.md).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/model_backend.h"
#include "engine/parallel/collectives.h"

namespace tandem {

struct RankGroupOptions {
  int data_parallel = 1;  // --data-parallel
  int expert_parallel = 1;  // --expert-parallel
  int tensor_parallel = 1;  // --tensor-parallel
  // The group's shared-memory segment: unique among the groups alive on the machine.
  std::string name;
  // One rank's KV pool (the engine's kv_cache_bytes): the shared host pool holds one, or
  // data_parallel of them.
  int64_t kv_cache_bytes = int64_t{512} << 20;
  // How long a rank waits for the others in a collective. Infinite by default: ranks 1..W-1
  // wait for rank 0's next step however long the engine idles, and a rank that dies is
  // still noticed at once (UNAVAILABLE on every rank).
  absl::Duration timeout = absl::InfiniteDuration();
};

// The ranks the flags ask for (max of the three; 1: no group). Errors: INVALID_ARGUMENT
// for a count below 1, above the backend's limit, or two counts above 1 and different
// (they split over the same ranks); UNIMPLEMENTED, saying so, for --tensor-parallel with
// --data-parallel, a device other than the CPU, or speculative decoding with ranks.
absl::StatusOr<int> RankGroupWorld(const RankGroupOptions& group, const BackendOptions& backend);

// Forks ranks 1..W-1, each loading its part of the DeepSeek-V2/V3 checkpoint in `dir` and
// following rank 0's steps, then loads rank 0's part here and returns its backend, which
// ends the group when destroyed (the other ranks exit). Call it before this process starts
// any thread (fork copies only the calling thread). Errors: RankGroupWorld's;
// FAILED_PRECONDITION for another architecture; rank 0's load errors; UNAVAILABLE when
// another rank failed to start (its error is on stderr).
absl::StatusOr<std::unique_ptr<ModelBackend>> StartCpuRankGroup(const std::string& dir,
                                                                const BackendOptions& backend,
                                                                const RankGroupOptions& group);

// The pids of ranks 1..W-1 of a backend StartCpuRankGroup returned (empty for another).
std::vector<pid_t> RankGroupPids(ModelBackend& backend);

// Ranks 1..W-1: runs every step rank 0 broadcasts over the shared host pool `pool` (its
// geometry from each step's plan), until rank 0 ends the group (OK) or the group fails
// (its error). A step refused as invalid before any collective of the pass was refused by
// rank 0 alike and is skipped.
absl::Status RunFollowerRank(parallel::Collectives& group, DeepseekModel& model, std::span<std::byte> pool);

}  // namespace tandem
