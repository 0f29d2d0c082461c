// One step of a replica whose ranks run the model together (docs/parallel.md): rank 0's
// scheduler decides the batch, and this is how the batch travels to the other ranks (a
// Collectives::Broadcast of bytes): every ForwardSequence field a rank needs to run the
// same pass, and the size of the KV pool the block ids index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward_batch.h"

namespace tandem {

// A decoded step: `batch` views the token and block vectors, which it owns (moving a plan
// keeps them valid; copying is not allowed).
struct RankStep {
  int64_t kv_blocks = 0;
  std::vector<std::vector<int32_t>> tokens, block_tables;
  std::vector<ForwardSequence> batch;

  RankStep() = default;
  RankStep(RankStep&&) = default;
  RankStep& operator=(RankStep&&) = default;
  RankStep(const RankStep&) = delete;
  RankStep& operator=(const RankStep&) = delete;
};

std::vector<std::byte> EncodeRankStep(std::span<const ForwardSequence> batch, int64_t kv_blocks);
// INVALID_ARGUMENT for bytes that are not a whole plan.
absl::StatusOr<RankStep> DecodeRankStep(std::span<const std::byte> bytes);

}  // namespace tandem
