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
#include "engine/model/latent_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
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

struct ForwardSequence {
  std::span<const int32_t> tokens;       // new tokens, at positions start_position...
  int64_t start_position = 0;            // tokens of this sequence already in the cache
  std::span<const int32_t> block_table;  // cache blocks covering start_position + tokens.size()
  bool all_logits = false;               // logits for every new token, not only the last
  bool no_logits = false;                // no logits at all (a prefill chunk short of the end)
};

struct ForwardOptions {
  AttentionForm attention = AttentionForm::kAuto;
  // Called on the calling thread once layer `layer` has written the latent KV of every
  // new token of the batch, before the next layer starts: lets a prefill stream each
  // layer's KV out while later layers compute.
  std::function<void(int64_t layer)> after_layer_kv;
  // The callback only enqueues work on the device backend's stream (device-to-device KV
  // writes): the backend need not wait for the layer before calling it.
  bool after_layer_kv_enqueues_only = false;
};

// How a device backend chooses one logits row's token (CudaDeepseekModel::ForwardSample,
// ModelBackend::ForwardSample): the CPU Sampler's parameters with its semantics
// (engine/runtime/sampler.h; temperature below 1e-5 is greedy), the seed and output
// position of UniformFromSeedStep, and the sequence's history for the penalties. The
// spans must stay valid during the call.
struct SampleRow {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int64_t step = 0;
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
};

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
                                             const ForwardOptions& options = {});

 private:
  DeepseekModel() = default;
  void Attention(const AttentionWeights& w, int64_t layer, std::span<const ForwardSequence> batch,
                 const std::vector<int64_t>& positions, const float* h, float* out, LatentKvCache& cache,
                 AttentionForm form);
  void DenseMlp(const MlpWeights& w, const float* h, int64_t rows, float* out, bool accumulate);
  void Moe(const MoeWeights& w, const float* h, int64_t rows, float* out);

  ModelConfig config_;
  std::unique_ptr<LoadedWeights> loaded_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::vector<float> inv_freq_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  bool bf16_kv_cache_ = false;
};

}  // namespace tandem
