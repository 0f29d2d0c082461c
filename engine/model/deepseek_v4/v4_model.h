// The DeepSeek-V4 forward pass on the CPU, float32, as transformers 5.17's
// DeepseekV4ForCausalLM computes it (shared/models/deepseek-v4.md §2): tokens expanded to
// hc_mult residual streams, each decoder layer's attention and MoE entered and left
// through an mHC site (Sinkhorn-normalized mixing), the streams collapsed by the hyper
// head, the final norm, the LM head.
//
// One sequence per call, in two forms with the same arithmetic: ForwardFull runs a whole
// sequence from position 0 with nothing carried (transformers with use_cache=False);
// Forward continues a SequenceState (v4_state.h) with any number of new tokens, so a
// prompt may be prefilled in chunks and decoded one token at a time. A position's logits
// come out bitwise the same in both forms, whatever the chunking and the thread count.
// Not yet: batches of sequences, the paged KV layout (the state is what it will hold).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_math.h"
#include "engine/model/deepseek_v4/v4_state.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::v4 {

class DeepseekV4Model {
 public:
  struct LoadOptions {
    int num_threads = 0;  // 0: all hardware threads
  };
  // Loads config.json and the weights of a checkpoint directory. Errors: those of
  // LoadDeepseekV4Config and LoadedWeights::Load.
  static absl::StatusOr<std::unique_ptr<DeepseekV4Model>> Load(const std::string& dir, const LoadOptions& options);
  static absl::StatusOr<std::unique_ptr<DeepseekV4Model>> Load(const std::string& dir) { return Load(dir, {}); }

  const DeepseekV4Config& config() const { return config_; }
  const ModelWeights& weights() const { return loaded_->weights(); }
  cpu::ThreadPool& thread_pool() { return *pool_; }

  // An empty state for one new sequence.
  SequenceState NewSequence() const;

  // Logits [tokens.size()][vocab_size] of every position of `tokens`, a whole sequence
  // from position 0. Errors: INVALID_ARGUMENT for no tokens, a token id outside the
  // vocabulary or more tokens than max_position_embeddings.
  absl::StatusOr<std::vector<float>> ForwardFull(std::span<const int32_t> tokens);

  // Runs `tokens` at positions state.num_tokens... and advances the state past them.
  // Returns logits for every new token ([tokens.size()][vocab_size]) or, unless
  // all_logits, for the last one only. Errors as ForwardFull; on error the state is
  // unchanged.
  absl::StatusOr<std::vector<float>> Forward(std::span<const int32_t> tokens, SequenceState& state,
                                             bool all_logits = true);

 private:
  DeepseekV4Model() = default;
  absl::Status Check(std::span<const int32_t> tokens, int64_t start) const;
  std::vector<float> Run(std::span<const int32_t> tokens, int64_t start, SequenceState* state, bool all_logits);
  // One mHC site over rows of streams [rows][N][D]: pre into `u`, post and comb kept.
  void HyperPre(const HyperConnectionWeights& w, const float* streams, int64_t rows, float* post, float* comb,
                float* u);

  DeepseekV4Config config_;
  std::unique_ptr<LoadedWeights> loaded_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  Rope main_rope_, compress_rope_;
};

}  // namespace tandem::v4
