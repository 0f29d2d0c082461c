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
// Batches of sequences and the paged KV layout are PagedV4Model's (v4_paged_model.h).
//
// Speculative decoding (docs/speculative-decoding.md): a Forward may also give the hidden
// streams the MTP layer reads and record what its last positions overwrite so that they
// can be taken back (v4_state_undo.h); RunMtp is the checkpoint's MTP layer.
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
#include "engine/model/deepseek_v4/v4_state_undo.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::v4 {

class DeepseekV4Model {
 public:
  struct LoadOptions {
    int num_threads = 0;  // 0: all hardware threads
    // The decoder layers' FP8 products read their inputs rounded as the GPU's block-scaled
    // FP8 GEMM does (cpu::MatmulParams::round_fp8_input): the reference for the GPU's
    // passes that use it (cuda_v4_model.h, Options::fp8_gemm). Not the MTP layer.
    bool fp8_activation_rounding = false;
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

  // What a Forward may also give.
  struct ForwardExtras {
    // The hidden streams of every new token after the last decoder layer, before the
    // hyper head ([tokens][hc_mult * hidden_size]): what the MTP layer reads.
    std::vector<float>* hidden = nullptr;
    // Positions from undo_from on may be taken back (refused drafts): what they overwrite
    // in the state is recorded here (TakeBack). At most sliding_window new tokens then.
    StateUndo* undo = nullptr;
    int64_t undo_from = 0;
  };
  absl::StatusOr<std::vector<float>> Forward(std::span<const int32_t> tokens, SequenceState& state, bool all_logits,
                                             const ForwardExtras& extras);

  // The checkpoint's first MTP layer (shared/models/deepseek-v4.md §2.11), if it has one.
  bool has_mtp() const { return !loaded_->weights().mtp.empty(); }
  // A fresh state of the MTP layer's attention (its sliding window).
  LayerState NewMtpState() const;
  // The MTP layer over consecutive MTP positions start, start + 1, ... of one sequence:
  // row r from the hidden streams `hidden` ([rows][hc_mult * hidden_size]) of the main
  // model at position start + r, or of the previous MTP run for a chained draft, and
  // tokens[r], the token at position start + r + 1. Advances `state` (the MTP layer's
  // ring, holding positions before start); writes the block's output streams into
  // `streams_out` ([rows][hc_mult * hidden_size]: a chained run's hidden) and returns the
  // last row's logits [vocab_size] (none without `logits`). has_mtp() and valid tokens are
  // the caller's to check.
  std::vector<float> RunMtp(const float* hidden, std::span<const int32_t> tokens, int64_t start, LayerState& state,
                            std::vector<float>* streams_out, bool logits = true);

 private:
  DeepseekV4Model() = default;
  absl::Status Check(std::span<const int32_t> tokens, int64_t start) const;
  std::vector<float> Run(std::span<const int32_t> tokens, int64_t start, SequenceState* state, bool all_logits,
                         const ForwardExtras& extras);
  // One decoder block (mHC + attention + mHC + MoE) over rows of streams [rows][N][D].
  void Block(const LayerWeights& lw, AttentionType type, MlpType mlp, std::span<const int32_t> tokens, int64_t start,
             LayerState* state, LayerUndo* undo, int64_t undo_from, float* streams);
  // The hyper head's collapse of rows of streams, a norm, the LM head: [rows][vocab].
  std::vector<float> Logits(const HyperHeadWeights& hc_head, const float* norm, const float* streams, int64_t rows);
  // One mHC site over rows of streams [rows][N][D]: pre into `u`, post and comb kept.
  void HyperPre(const HyperConnectionWeights& w, const float* streams, int64_t rows, float* post, float* comb,
                float* u);

  DeepseekV4Config config_;
  std::unique_ptr<LoadedWeights> loaded_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  bool fp8_activation_rounding_ = false;  // LoadOptions::fp8_activation_rounding
  Rope main_rope_, compress_rope_;
};

}  // namespace tandem::v4
