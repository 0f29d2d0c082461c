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
#include "engine/model/forward_batch.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
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
  };
  // Loads config.json and the safetensors weights of a checkpoint directory.
  static absl::StatusOr<std::unique_ptr<DeepseekModel>> Load(const std::string& dir,
                                                            const LoadOptions& options);
  static absl::StatusOr<std::unique_ptr<DeepseekModel>> Load(const std::string& dir) {
    return Load(dir, LoadOptions{});
  }

  const ModelConfig& config() const { return config_; }
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
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, LatentKvCache& cache,
                                             const DeepseekForwardOptions& options = {});

 private:
  DeepseekModel() = default;
  void Attention(const AttentionWeights& w, int64_t layer, std::span<const ForwardSequence> batch,
                 const std::vector<int64_t>& positions, const float* h, float* out, LatentKvCache& cache,
                 AttentionForm form);
  void DenseMlp(const MlpWeights& w, const float* h, int64_t rows, float* out, bool accumulate);
  void Moe(const MoeWeights& w, int64_t layer, const float* h, int64_t rows, float* out,
           const DeepseekForwardOptions& options);

  ModelConfig config_;
  std::unique_ptr<LoadedWeights> loaded_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<float> inv_freq_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  bool bf16_kv_cache_ = false;
};

}  // namespace tandem
