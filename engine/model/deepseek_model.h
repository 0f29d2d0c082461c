// The DeepSeek-V2/V3 forward pass on the CPU: a batch of sequences, each contributing
// some new tokens on top of what its latent KV cache already holds (a prefill chunk or
// one decode token), in one pass whose matrix products read each weight once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/forward_batch.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/parallel_layout.h"
#include "engine/model/weights.h"
#include "engine/parallel/collectives.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem {

// Which form of multi-head latent attention to run (mla_attention.h). kAuto: absorbed for
// every position, decode steps and prefill chunks alike. The two forms round differently,
// and a position must come out bitwise the same however it is reached (one decode step,
// a prefill pass or chunk of any size, any batch, any thread count), or a request
// re-prefilled after a migration or preemption would continue with other seeded draws
// than the undisturbed run. The absorbed form costs 2 R + P multiply-adds per
// query-position pair against the expanded form's nope + P + v plus the expansion
// (ModelConfig::AbsorbedAttentionCheaper): long prompts prefill somewhat slower on the CPU
// (bench/README.md, cpu_prefill_attention_bench). kExpanded stays for tests.
enum class AttentionForm { kAuto, kExpanded, kAbsorbed };

// ForwardOptions with the DeepSeek backends' own choice of attention form (the CPU
// model's and CudaDeepseekModel's Forward); the engine passes ForwardOptions, which
// always runs kAuto.
struct DeepseekForwardOptions {
  AttentionForm attention = AttentionForm::kAuto;
  std::function<void(int64_t layer)> after_layer_kv;  // as ForwardOptions'
  bool after_layer_kv_enqueues_only = false;          // as ForwardOptions'
  std::function<void()> before_sampling;              // as ForwardOptions'
  // The CPU model only: called after each MoE layer's routing with its float32 router
  // logits, chosen experts and weights ([rows][...], rows in batch order); it may rewrite
  // the experts and weights, which the layer then uses. For tests that must tell a routing
  // near-tie (which a GPU's roundings can resolve the other way) from an error.
  std::function<void(int64_t layer, const cpu::MoeRoutingParams& routing)> after_routing;
};
inline DeepseekForwardOptions ForDeepseek(const ForwardOptions& o) {
  return {.after_layer_kv = o.after_layer_kv,
          .after_layer_kv_enqueues_only = o.after_layer_kv_enqueues_only,
          .before_sampling = o.before_sampling};
}

class DeepseekModel {
 public:
  struct LoadOptions {
    int num_threads = 0;  // 0: all hardware threads
    // Rounds every latent KV entry to bf16 as it is written, the values a bf16 cache (the
    // CUDA backend's) holds; storage stays float32. For comparing with a GPU at its cache
    // precision: on random-weight models that rounding alone flips near-tied routing.
    bool bf16_kv_cache = false;
    // FP8 checkpoints: the input of every product with an FP8 weight (attention
    // projections, MLPs, experts) rounded as the CUDA backend's FP8 GEMMs round theirs
    // (CudaDeepseekModel::LoadOptions::fp8_prefill): to bf16, then to e4m3 per row and 128
    // columns with DeepSeek's scale (fp8_gemm.h). A reference with the GPU's rounding for
    // comparing its FP8 prefill; not with tensor_parallel.
    bool fp8_activation_rounding = false;
    // Speculative decoding: run the checkpoint's first MTP layer (Draft, ForwardSequence::
    // mtp) over a cache with one layer more than the model (the MTP layer's KV).
    // FAILED_PRECONDITION when the checkpoint has none.
    bool mtp = false;
    // A rank of a replica that spans several ranks (docs/parallel.md): `group` (not owned,
    // outliving the model) connects the ranks, and this rank holds only its routed
    // experts (expert_parallel: ParallelLayout::LocalExperts) and its rows of the LM
    // head and of the dense MLPs (tensor_parallel). Every rank then calls Forward with
    // the same batch and cache contents, collectively; attention and the shared experts
    // run whole on every rank. The logits are bitwise those of one rank.
    // With data_parallel, each rank calls Forward with its own sequences only (any
    // number, zero included) over its own cache, still collectively (the MoE layers'
    // expert exchange); data_parallel.h gathers the logits. FAILED_PRECONDITION with mtp
    // (not split yet); UNIMPLEMENTED for data_parallel with tensor_parallel (the dense
    // parts' split needs every rank's rows: not done).
    parallel::Collectives* group = nullptr;
    bool expert_parallel = false;
    bool tensor_parallel = false;
    bool data_parallel = false;
  };
  // Loads config.json and the safetensors weights of a checkpoint directory.
  static absl::StatusOr<std::unique_ptr<DeepseekModel>> Load(const std::string& dir,
                                                            const LoadOptions& options);
  static absl::StatusOr<std::unique_ptr<DeepseekModel>> Load(const std::string& dir) {
    return Load(dir, LoadOptions{});
  }

  const ModelConfig& config() const { return config_; }
  const ParallelLayout& layout() const { return layout_; }
  const ModelWeights& weights() const { return loaded_->weights(); }
  cpu::ThreadPool& thread_pool() { return *pool_; }

  // A cache sized for this model with `num_blocks` blocks per layer.
  LatentKvCache MakeKvCache(int64_t num_blocks) const {
    return LatentKvCache(config_.num_hidden_layers, num_blocks, config_.kv_entry_dim());
  }

  // Runs the batch, writing each new token's latent KV into `cache` and returning logits,
  // [rows][vocab] with rows in batch order: every token of sequences with all_logits,
  // none of sequences with no_logits, the last token of the others. Errors: INVALID_ARGUMENT for token ids out of the
  // vocabulary, positions past max_position_embeddings, or block tables too short.
  // With LoadOptions::mtp also the MTP layer's slots of sequences with `mtp`, and the
  // hidden states of sequences with `keep_hidden` (kept_hidden()); without it those are
  // FAILED_PRECONDITION. A sequence with first_kv_cached writes no KV for its first token.
  // In a parallel group also the group's errors (after which the group is unusable).
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, LatentKvCache& cache,
                                             const DeepseekForwardOptions& options = {});
  // Forward's checks of the batch alone (no collective, nothing computed): OK when Forward
  // would not return INVALID_ARGUMENT or FAILED_PRECONDITION for the batch.
  absl::Status CheckBatch(std::span<const ForwardSequence> batch, const LatentKvCache& cache) const;

  // Speculative decoding (docs/speculative-decoding.md): the MTP layer over each
  // sequence's slots, then its chained drafts; per sequence its drafts in order (fewer than
  // max_drafts when one falls below min_confidence). Errors: FAILED_PRECONDITION without
  // LoadOptions::mtp; INVALID_ARGUMENT for tokens outside the vocabulary, hidden rows the
  // last Forward did not keep, slots past the context or the block tables.
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             LatentKvCache& cache,
                                                             const DeepseekForwardOptions& options = {});
  bool has_mtp() const { return mtp_ != nullptr; }
  // [rows][hidden_size]: the hidden states the last Forward kept (ForwardSequence::keep_hidden).
  std::span<const float> kept_hidden() const { return kept_hidden_; }

 private:
  // One sequence's consecutive rows in a layer's attention: RoPE positions first_position
  // onwards, KV at those positions plus the layer's slot offset (the MTP layer's is 1).
  struct AttentionRows {
    int64_t first_position = 0;
    int64_t num_tokens = 0;
    std::span<const int32_t> block_table;
    bool skip_first_write = false;  // the first row's KV is already in the cache
  };

  DeepseekModel() = default;
  // The batch checked and flattened: row r of the activations is tokens[r]; logit_rows
  // are the rows whose logits Forward returns; seqs the rows of each sequence.
  struct FlatBatch {
    std::vector<int32_t> tokens;
    std::vector<int64_t> logit_rows;
    std::vector<AttentionRows> seqs;
  };
  absl::Status Flatten(std::span<const ForwardSequence> batch, const LatentKvCache& cache, FlatBatch* flat) const;
  // A decoder layer over rows `x` ([rows][hidden], updated in place); its KV in cache layer
  // `cache_layer` at position + slot_offset.
  void DecoderLayer(const DecoderLayerWeights& layer, int64_t layer_index, int64_t cache_layer, int64_t slot_offset,
                    std::span<const AttentionRows> seqs, float* x, int64_t rows, LatentKvCache& cache,
                    const DeepseekForwardOptions& options);
  void Attention(const AttentionWeights& w, int64_t cache_layer, int64_t slot_offset,
                 std::span<const AttentionRows> seqs, const float* h, float* out, LatentKvCache& cache,
                 AttentionForm form);
  // The MTP layer over `rows` rows: hidden[r] (the previous hidden state) and tokens[r];
  // writes their KV and leaves its output (before the shared head's norm) in y.
  void MtpLayer(std::span<const AttentionRows> seqs, const float* hidden, const int32_t* tokens, int64_t rows,
                float* y, LatentKvCache& cache, const DeepseekForwardOptions& options);
  // The main Forward's MTP pass over the sequences with `mtp`.
  void FillMtpSlots(std::span<const ForwardSequence> batch, const float* x, LatentKvCache& cache,
                    const DeepseekForwardOptions& options);
  // The MTP's shared head over each row of y: [rows][vocab] logits.
  std::vector<float> MtpLogits(const float* y, int64_t rows);
  void DenseMlp(const MlpWeights& w, const float* h, int64_t rows, float* out, bool accumulate);
  // A dense MLP split by rows (MlpWeights::inter_split, hidden_split): the rank's
  // intermediate features, gathered, then its output features, gathered.
  void TensorParallelMlp(const MlpWeights& w, const float* h, int64_t rows, float* out);
  // The routed experts of a MoE layer under expert parallelism: the rank runs its block
  // of the batch's rows through ExpertParallelMoe, then the blocks are gathered; under
  // data parallelism its rows are its own sequences', run as they are.
  void ExpertParallelRoutedExperts(const MoeWeights& w, const float* h, int64_t rows, const int32_t* ids,
                                   const float* weights, float* out);
  // logits[rows][vocab] of the final-normed rows `last`, the LM head split or whole.
  std::vector<float> LmHead(const float* last, int64_t rows);
  // One SwiGLU MLP over its rows: x [rows][hidden] in, y [rows][hidden] out (or added to).
  struct MlpRun {
    const MlpWeights* w;
    const float* x;
    int64_t rows;
    float* y;
    bool accumulate = false;
    std::vector<float> gate, up;
  };
  void RunMlps(std::span<MlpRun> runs);
  void Moe(const MoeWeights& w, int64_t layer, const float* h, int64_t rows, float* out,
           const DeepseekForwardOptions& options);

  ModelConfig config_;
  std::unique_ptr<LoadedWeights> loaded_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<float> inv_freq_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  bool bf16_kv_cache_ = false;
  bool fp8_activation_rounding_ = false;
  // x [rows][stride] as the product with `w` reads it: x itself, or (fp8_activation_rounding
  // and an FP8 weight) its rounded copy in `buf`, [rows][w.cols].
  const float* Fp8Input(const float* x, int64_t rows, int64_t stride, const cpu::WeightMatrix& w,
                        std::vector<float>& buf, int64_t* used_stride) const;
  const MtpLayerWeights* mtp_ = nullptr;  // LoadOptions::mtp: the first MTP layer
  std::vector<float> kept_hidden_;

  ParallelLayout layout_;
  parallel::Collectives* group_ = nullptr;
  std::unique_ptr<ExpertParallelMoe> expert_parallel_;
  // The first error of a collective in this Forward: the layers (void) skip the collectives
  // after it, and Forward returns it.
  absl::Status parallel_status_;
  std::vector<float> gather_scratch_;
};

}  // namespace tandem
