// The DeepSeek-V2/V3 forward pass on an NVIDIA GPU (docs/design.md §7-§8), with exactly the
// contract of DeepseekModel::Forward (deepseek_model.h): the same ForwardSequence and
// DeepseekForwardOptions, block tables into a paged latent KV cache, logits returned to the host
// as float32. The GPU holds bf16 weights (cuda_weights.h), a paged bf16 latent cache
// ([layer][block][64][kv_lora_rank + rope]) and every activation buffer, preallocated
// for max_batch_tokens tokens of max_seqs sequences: no allocation per step.
//
// Numerics: float32 residual stream, bf16 GEMM operands with float32 accumulation,
// float32 norms, rotary embedding, router and routing.
//
// Attention: prefill chunks (several new tokens) in the expanded form (the chunk's
// latents gathered, projected by kv_b into per-head keys and values, causal attention);
// single decode tokens in the absorbed form (q_nope . W_UK per head, attention over the
// latents, then W_UV), batched over sequences. MoE: routing on the GPU, tokens permuted
// by expert, routed and shared experts in one grouped GEMM with SiLU fused; large
// batches (prefill) run cuBLAS per expert instead.
//
// Decode steps (every sequence one token, logits for all; or, with speculative decoding,
// every sequence a verify chunk of one length) replay a CUDA graph captured once per
// (rows, context bucket, queries per sequence) when cuda_graphs is on. Steps of at most
// fused_decode_max_tokens decode tokens take fused kernels (8 launches per MoE layer instead
// of ~17: RMSNorm fused into float32-activation GEMVs, MLA prepare with the W_UK product,
// the split combine with W_UV, one MoE front-end kernel for norm + router + routing +
// permutation, the expert projections as matrix-vector products), and steps of at most
// moe_grouped_max_tokens tokens chain their kernels with programmatic dependent launch
// (kernels/cuda/launch_control.h).
//
// Not thread-safe: one thread owns the model (the engine thread), like DeepseekModel.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/model_config.h"

namespace tandem {

class CudaDeepseekModel {
 public:
  struct LoadOptions {
    int device = 0;
    int64_t max_batch_tokens = 2048;  // new tokens of one Forward
    int64_t max_seqs = 256;           // sequences of one Forward
    // Longest sequence (cached + new tokens); 0: min(max_position_embeddings, 32768).
    int64_t max_context = 0;
    // KV cache blocks per layer; 0: what gpu_memory_utilization leaves after weights and
    // activations.
    int64_t kv_blocks = 0;
    double gpu_memory_utilization = 0.9;  // of the GPU's total memory, for this process
    int64_t max_logit_rows = 0;           // logits rows per LM-head pass; 0: max(max_seqs, 256)
    bool cuda_graphs = true;              // replay decode steps from captured graphs
    // Dense GEMMs of at most this many rows run the grouped bf16 kernel (memory-bound
    // decode shapes); larger ones cuBLAS. 0: always cuBLAS.
    int64_t small_gemm_max_rows = 64;
    // MoE layers of at most this many tokens run the grouped kernel (graph-safe, no host
    // synchronization); larger ones cuBLAS per expert after reading the expert counts.
    int64_t moe_grouped_max_tokens = 256;
    // Steps of at most this many tokens give the grouped-kernel GEMMs split activations
    // (bf16 value + bf16 remainder, ~16 mantissa bits: near-float32 results at no extra
    // weight traffic, grouped_gemm.h); larger steps round GEMM inputs to bf16.
    int64_t split_activations_max_tokens = 64;
    // Decode steps of at most this many tokens (every sequence one token) run the fused
    // small-batch kernels described above; 0: never. At most 4.
    int64_t fused_decode_max_tokens = 4;
    // Those fused steps run the MoE expert projections as matrix-vector products
    // (kernels/cuda/moe_expert_gemv.h: every weight load of a pass in flight, the shared
    // experts' weights read before the routing is known) instead of the grouped GEMM.
    bool moe_expert_gemv = true;
    // With the expert GEMVs (steps of a few tokens): the down projection's sums into the
    // residual in a fixed order (MoeExpertGemvParams::partial) instead of float32 atomics in
    // completion order (the one run-to-run varying sum of a batch-1 step). Costs 2.4 % of a
    // batch-1 step on the H200 (2.080 vs 2.031 ms, same run, 2026-11-30). Off: other sums
    // (the prefill's split-K) vary from run to run as well, so a seeded sampled request is
    // reproducible only up to draws on a probability boundary (docs/performance.md).
    bool deterministic_moe_down = false;
    // With the expert GEMVs after the fused routing kernel: the shared experts' gate_up
    // tiles computed while the routing runs, from the residual normalized again by each
    // block (MoeExpertGemvParams::norm_x; the same bits as the routing kernel's norm).
    bool moe_shared_experts_early = true;
    // The absorbed attention's queries as bf16 value + remainder and its probabilities
    // likewise (MlaDecodeParams::q_lo) instead of bf16, where the decode kernel honours them
    // (models of at most 32 heads off kv_lora_rank 512 + rope 64 on sm_90: tiny, tiny-v2).
    // There, prefill chunks short enough that the absorbed form needs fewer multiply-adds
    // than expanding the cached prefix also run absorbed (DeepseekForwardOptions' kAuto form).
    bool split_decode_queries = true;
    // Programmatic dependent launch between the kernels of steps of at most
    // moe_grouped_max_tokens tokens (graph-captured decode steps included).
    bool programmatic_launch = true;
    // One computation path for every step (docs/batch-invariance.md): a sequence's logits
    // do not depend on its batch companions or on how its prompt is chunked. Overrides the
    // size-dependent choices above: every dense layer and expert on the grouped kernel
    // without split K and with split activations, the router and the absorbed attention's
    // W_UK / W_UV on InvariantGemm (k in order), every position through the absorbed decode
    // kernel with one KV split and a fixed tile shape, the MoE combine without atomics, no
    // fused small-batch kernels.
    bool batch_invariant = false;
    // FP8 checkpoints (block-scaled E4M3, `make-model --dtype fp8`, DeepSeek-V3's layout):
    // the fused decode steps multiply the attention, MLP and expert linears in their stored
    // FP8 form (a byte a weight read instead of the bf16 copy's two), the other steps the
    // bf16 copies (cuda_weights.h: both forms kept, 1.5x the bf16 memory; worker
    // --fp8-decode). Off by default for that memory (at DeepSeek-V2-Lite's shapes on an H100
    // the decode step is 1.11x as fast, docs/performance.md), or a model without FP8
    // weights: every step on the bf16 copies, no FP8 forms loaded. Not with batch_invariant.
    bool fp8_decode = false;
    // Those FP8 products on the tensor-core GEMV where it applies (k a multiple of 64 and
    // enough 16-row tiles, quantized_gemv.h); off: the scalar kernel (benchmarks compare).
    bool fp8_tensor_cores = true;
    // FP8 checkpoints: prefill steps of at least 128 tokens multiply the attention
    // projections (q/kv_a, q_b, o_proj) and the dense MLPs in FP8 on the tensor cores
    // (cuda::Fp8Gemm, sm_90 only), and steps above moe_grouped_max_tokens the MoE layers'
    // experts too (one grouped launch per projection, no host round trip for the expert
    // counts); their activations quantized per token and 128 columns as DeepSeek's
    // inference code does. kv_b and the router stay on the bf16 / float32 copies. Loads
    // the FP8 forms as fp8_decode does. Not with batch_invariant.
    bool fp8_prefill = false;
    // Speculative decoding (docs/speculative-decoding.md): the checkpoint's first MTP layer
    // loaded, its KV one layer after the decoder layers' (ForwardSequence::mtp, Draft).
    bool mtp = false;
  };

  // How ForwardSample chooses each logits row's token (deepseek_model.h).
  using SampleRow = ::tandem::SampleRow;

  // Loads config.json and the safetensors weights of a checkpoint directory onto the GPU.
  // Errors: as DeepseekModel::Load, plus FAILED_PRECONDITION without a usable GPU and
  // RESOURCE_EXHAUSTED when the GPU lacks memory.
  static absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> Load(const std::string& dir, const LoadOptions& options);
  // A model of the architecture in config_json (vocab_size required) whose weights are
  // generated on the GPU with the values `tandem make-model --seed seed` writes in bf16:
  // bit-identical to loading that checkpoint, without writing or reading it (benchmarks).
  static absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> CreateGenerated(const std::string& config_json,
                                                                           uint64_t seed,
                                                                           const LoadOptions& options);
  ~CudaDeepseekModel();

  const ModelConfig& config() const;
  std::string device_name() const;   // "cuda:0 (NVIDIA H200)"
  int64_t num_blocks() const;         // KV cache blocks per layer
  int64_t max_context() const;
  uint64_t weight_bytes() const;      // GPU bytes of the weights
  uint64_t kv_cache_bytes() const;    // GPU bytes of the KV cache
  uint64_t activation_bytes() const;  // GPU bytes of the preallocated activations
  // Linear layers (a MoE layer's experts counted once) whose FP8 form the decode steps use
  // (LoadOptions::fp8_decode on an FP8 checkpoint), and their GPU bytes.
  int64_t fp8_linears() const;
  uint64_t fp8_weight_bytes() const;
  // FP8 GEMMs run so far (LoadOptions::fp8_prefill): one per linear layer and step.
  int64_t fp8_gemms() const;

  // DeepseekModel::Forward on the GPU's own cache. Errors: INVALID_ARGUMENT as the CPU
  // model, plus batches beyond max_batch_tokens / max_seqs / max_context; INTERNAL for
  // CUDA failures.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch,
                                             const DeepseekForwardOptions& options = {});
  // The same, but only the argmax of each logits row (greedy, ties to the lowest id)
  // crosses to the host.
  absl::StatusOr<std::vector<int32_t>> ForwardGreedy(std::span<const ForwardSequence> batch,
                                                     const DeepseekForwardOptions& options = {});
  // The same, but each logits row's token is sampled on the GPU (kernels/cuda/sampling.h)
  // as the CPU Sampler would choose it from the same logits: rows[i] for logits row i (one
  // per row, in Forward's order). Token ids only cross to the host. INVALID_ARGUMENT for a
  // row count that does not match or history ids outside the vocabulary.
  absl::StatusOr<std::vector<int32_t>> ForwardSample(std::span<const ForwardSequence> batch,
                                                     std::span<const SampleRow> rows,
                                                     const DeepseekForwardOptions& options = {});
  // ForwardSample in two halves (ModelBackend::LaunchSample's contract): LaunchSample
  // enqueues the step on the GPU and returns once its inputs are copied (a step of more
  // logits rows than one LM-head pass runs to completion here); CollectSample waits for
  // its tokens. Every other call in between is ordered after the launched step.
  absl::Status LaunchSample(std::span<const ForwardSequence> batch, std::span<const SampleRow> rows,
                            const DeepseekForwardOptions& options = {});
  absl::StatusOr<std::vector<int32_t>> CollectSample();

  // Speculative decoding with LoadOptions::mtp: DeepseekModel::Draft's contract on the
  // GPU's cache, and the hidden states the last Forward kept (one row, for a prefill
  // replica to hand over).
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch);
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row);
  bool has_mtp() const;

  // KV export/import (float32 on the host, bf16 in the cache). ReadKvBlocks writes
  // block_ids.size() blocks of [64][kv_entry_dim] floats of one layer; ReadKvEntries the
  // entries of positions [first_position, first_position + n) of a sequence;
  // WriteKvEntries stores n entries [n][kv_entry_dim] at those positions.
  absl::Status ReadKvBlocks(int64_t layer, std::span<const int32_t> block_ids, float* host);
  absl::Status ReadKvEntries(int64_t layer, std::span<const int32_t> block_table, int64_t first_position, int64_t n,
                             float* host);
  absl::Status WriteKvEntries(int64_t layer, std::span<const int32_t> block_table, int64_t first_position,
                              const float* entries, int64_t n);

  // For benchmarks: bytes of weights the last Forward had to read (embedding rows, every
  // dense weight, the experts at least one token was routed to, LM head rows computed).
  absl::StatusOr<uint64_t> LastForwardWeightBytes();
  // Turns graph replay on or off (for measurements of both).
  void set_cuda_graphs(bool on);
  // For measurements: LoadOptions::programmatic_launch and fused_decode_max_tokens
  // (captured graphs are dropped).
  void set_programmatic_launch(bool on);
  void set_fused_decode_max_tokens(int64_t tokens);
  // For measurements: LoadOptions::moe_expert_gemv (captured graphs are dropped).
  void set_moe_expert_gemv(bool on);
  void set_deterministic_moe_down(bool on);
  void set_moe_shared_experts_early(bool on);
  void set_split_decode_queries(bool on);
  // Off: FP8 checkpoints' decode steps on the bf16 copies (the forms stay loaded).
  void set_fp8_decode(bool on);
  void set_fp8_tensor_cores(bool on);
  // Off after a load with LoadOptions::fp8_prefill: the bf16 copies again (benchmarks
  // compare); on without that load option: no effect (no buffers for it).
  void set_fp8_prefill(bool on);
  // For benchmarks: with step events on, each Forward records a CUDA event when its GPU
  // work begins (before the batch upload) and when it ends (after the results are read
  // back); TakeStepTimes returns {begin, end} per recorded step in ms since the first
  // recorded begin, and clears the record. With profiling on, steps run without graphs
  // and TakeProfile returns the GPU ms spent per kind of launch (summed, cleared).
  void set_step_events(bool on);
  absl::StatusOr<std::vector<std::pair<double, double>>> TakeStepTimes();
  void set_profiling(bool on);
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeProfile();
  // With the kernel timeline on, steps run without graphs but otherwise as usual
  // (programmatic launch included) with a GPU timestamp after each kind of launch;
  // TakeKernelTimeline returns, for the last step, the ms each kind of launch added to
  // the step's chain (summed over layers; each figure includes one timestamp kernel).
  void set_kernel_timeline(bool on);
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeKernelTimeline();
  // Waits for the GPU work of this model.
  absl::Status Synchronize();
  // The CUDA stream this model runs on (cudaStream_t), for event timing.
  void* stream() const;

  // The paged KV pool, for device-to-device transfer (cuda_peer_kv.h): bf16 entries,
  // [num_layers][num_blocks][64][entry_bytes] (the MTP layer's last when loaded).
  struct KvPool {
    void* base = nullptr;
    uint64_t bytes = 0;
    int64_t num_layers = 0;
    int64_t num_blocks = 0;
    int64_t entry_bytes = 0;
    int64_t max_blocks_per_seq = 0;  // covers max_context
    int device = 0;
  };
  KvPool kv_pool() const;

  class Impl;

 private:
  explicit CudaDeepseekModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
