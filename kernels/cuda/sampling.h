// Token sampling on the GPU with exactly the CPU Sampler's semantics
// (engine/runtime/sampler.h), one thread-block cluster per logits row (each block a slice of
// the vocabulary; SampleParams::cluster_blocks), token ids out:
//   1. penalties, in place on the logits: repetition over the distinct tokens of prompt and
//      output (logit > 0 ? logit / r : logit * r), then frequency (count times) and presence
//      over the output tokens, each subtracted in float;
//   2. temperature < kSampleGreedyTemperature: the argmax, ties to the lowest id;
//   3. else weights w = SamplerExp((logit - max) / temperature) (the same Cephes polynomial,
//      fused the same way: bit-identical weights; w = 0 below e^-87: never drawn), then in
//      canonical order (logit descending, id ascending): top-k keeps the k first, min-p
//      the tokens with w >= min_p when fewer, top-p the shortest prefix whose mass reaches
//      top_p times the top-k mass, and one uniform u = UniformFromSeedStep(seed, step)
//      (SplitMix64, the same bits) picks the first token at which the cumulative mass of
//      the kept tokens exceeds u times their total.
// Masses are float weights summed in double, as on the CPU, but in another order: the
// token can differ from the CPU's only when u times the mass (or top_p times it) falls
// within ~1e-15 (relative) of a cumulative boundary. NaN logits: unspecified (the CPU
// Sampler aborts). Deterministic: the same inputs and cluster size give the same token on
// every run (the blocks' partial sums are combined in a fixed order).
//
// How: every boundary of the canonical order (the k-th token, the top-p prefix, the
// draw) is found by a radix descent over the logits' order-preserving bits (8 bits per
// pass; per-bin token counts and double masses, accumulated warp by warp without
// atomics; each block's histogram of its slice, merged over the cluster through
// distributed shared memory), until the bin holding the boundary has at most 2048 tokens;
// those are gathered from the cluster, sorted in shared memory and walked in canonical
// order. A whole row is read about 4 times per boundary.
//
// Supports programmatic dependent launch (launch_control.h). No allocation inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

namespace tandem::cuda {

// engine/runtime/sampling_params.h's kGreedyTemperature.
inline constexpr float kSampleGreedyTemperature = 1e-5f;

// One row's parameters (SamplingParams' fields, validated as there).
struct SampleRowParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // <= 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_begin = 0;  // the row's entries of SampleParams::penalties
  int32_t penalty_count = 0;
  uint64_t seed = 0;
  int64_t step = 0;  // output position of the token being sampled
};

// A distinct token of the sequence's prompt and output, with its number of occurrences in
// the output (0: prompt only).
struct PenaltyEntry {
  int32_t id = 0;
  int32_t output_count = 0;
};

struct SampleParams {
  float* logits = nullptr;  // [rows][stride]: penalized in place
  int64_t stride = 0;
  int rows = 0;
  int vocab = 0;
  const SampleRowParams* row_params = nullptr;  // device [rows]
  const PenaltyEntry* penalties = nullptr;       // device; may be null without penalties
  int32_t* out = nullptr;                        // device [rows]: the sampled token ids
  // Blocks per row (a thread-block cluster): a power of two up to 16 that the device can
  // run; 0 = SampleClusterBlocks(rows).
  int cluster_blocks = 0;
};

cudaError_t SampleTokens(const SampleParams& p, cudaStream_t stream);

// The blocks per row SampleTokens uses by default: as many as keep the multiprocessors busy
// (a power of two, up to 16, 1 from as many rows as multiprocessors on).
int SampleClusterBlocks(int rows);

// Host helper: appends the penalty entries of one sequence (each distinct id of prompt and
// output once, in first-seen order).
void AppendPenaltyEntries(const int32_t* prompt, size_t prompt_len, const int32_t* output, size_t output_len,
                          std::vector<PenaltyEntry>* entries);

}  // namespace tandem::cuda
