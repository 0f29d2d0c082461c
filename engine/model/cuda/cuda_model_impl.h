// Internals of CudaDeepseekModel shared by its source files: the device state, the
// per-step plan (how a batch maps onto rows, attention jobs and block tables) and the
// layer launchers. Not part of the public API.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/cuda/cuda_deepseek_model.h"
#include "engine/model/cuda/cuda_weights.h"
#include "engine/model/cuda/device_memory.h"
#include "kernels/cuda/cublas_gemm.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_expert_gemv.h"

namespace tandem {

namespace cuda {
struct MoeRoutingParams;
struct MoePermuteParams;
}  // namespace cuda

namespace cuda_model {

// One attention launch group of a step. Absorbed: num_seqs sequences of q_per_seq query
// tokens each, rows [row_begin, row_begin + num_seqs * q_per_seq), block tables and cache
// lengths at table_row.. (the decode group, or one chunk of a sequence forced into the
// absorbed form). Expanded: one sequence's rows attending over its num_kv positions.
struct AttentionJob {
  bool absorbed = true;
  int64_t row_begin = 0;
  int64_t num_seqs = 1;
  int64_t q_per_seq = 1;
  int64_t table_row = 0;
  int64_t max_cache_len = 0;  // absorbed: bound of the cache lengths; expanded: num_kv
};

// Device pointers of a step's metadata, packed in one buffer (one upload per step).
struct StepMeta {
  int32_t* tokens = nullptr;        // [rows]
  int32_t* positions = nullptr;     // [rows]
  int32_t* slots = nullptr;         // [rows]
  int32_t* logit_rows = nullptr;    // [out_rows]: internal row of each logits row, output order
  int32_t* cache_lens = nullptr;    // [table_rows]
  int32_t* block_tables = nullptr;  // [table_rows][max_blocks_per_seq]
};

struct StepPlan {
  // The MTP layer's pass (docs/speculative-decoding.md): position p reads and writes cache
  // slot p + 1 (MlaDecodeParams::kv_offset; slots already hold it).
  int64_t kv_offset = 0;
  int64_t rows = 0;
  int64_t out_rows = 0;
  int64_t table_rows = 0;
  int64_t rope_out_rows = 0;  // rows whose rotated query rope parts the absorbed form reads
  std::vector<AttentionJob> jobs;
  // Every sequence a decode token or a verify chunk (speculative decoding), absorbed, logits
  // for every row.
  bool decode_only = false;
  std::vector<int64_t> seq_rows;  // the first activation row of each sequence, in batch order
  size_t meta_bytes = 0;
  StepMeta meta;  // device pointers
};

// Packs the metadata arrays of a step; base null computes the size only.
StepMeta LayoutMeta(char* base, int64_t rows, int64_t out_rows, int64_t table_rows, int64_t max_blocks_per_seq,
                    size_t* bytes);

// Preallocated activations (sizes: CudaDeepseekModel::Impl::AllocateActivations).
// The tables that run a dense MLP of T <= kMoeExpertGemvMaxRows tokens as the one static
// group of the expert GEMVs (device memory, written once at load).
struct DenseMlpPlan {
  int32_t rows[cuda::kMoeExpertGemvMaxRows];              // A row and output row of row m: m
  int32_t offsets[cuda::kMoeExpertGemvMaxRows + 1][2];    // the group offsets {0, T} for T tokens
  int32_t active_group = 0;                               // the active group list {0}
  int32_t num_active = 1;                                 // its length
};

struct Activations {
  float* x = nullptr;  // residual stream [T][hidden]
  float* h_f32 = nullptr;
  __nv_bfloat16* h_bf16 = nullptr;
  __nv_bfloat16* h_lo = nullptr;  // split activations: remainders of the bf16 buffers
  __nv_bfloat16* qa_lo = nullptr;
  __nv_bfloat16* attn_lo = nullptr;
  __nv_bfloat16* act_lo = nullptr;
  __nv_bfloat16* final_lo = nullptr;
  float* qkv = nullptr;             // [T][q_rows + rank + rope]
  __nv_bfloat16* qa_bf16 = nullptr;  // [T][q_lora_rank]
  float* q_f32 = nullptr;           // [T][heads * qk] (q_lora models)
  __nv_bfloat16* q_bf16 = nullptr;   // [T][heads][qk]
  __nv_bfloat16* q_dec = nullptr;    // [T][heads][rank + rope]
  __nv_bfloat16* q_dec_lo = nullptr;  // the same queries' bf16 remainders (split decode queries)
  float* lat_out = nullptr;         // [T][heads][rank]
  __nv_bfloat16* lat_bf16 = nullptr;
  float* attn_f32 = nullptr;  // [T][heads * v]
  __nv_bfloat16* attn_bf16 = nullptr;
  __nv_bfloat16* kv_gathered = nullptr;  // [max_context][rank + rope]
  __nv_bfloat16* kv_expanded = nullptr;  // [max_context][heads * (nope + v)]
  void* decode_ws = nullptr;
  size_t decode_ws_bytes = 0;
  float* gu = nullptr;  // [max(T * 2 inter, P * 2 moe_inter)]
  __nv_bfloat16* act_bf16 = nullptr;
  float* router_logits = nullptr;  // [T][experts]
  int32_t* expert_ids = nullptr;   // [T][top_k]
  float* expert_weights = nullptr;
  int32_t* group_offsets = nullptr;  // [layers][groups + 1]
  int32_t* active_groups = nullptr;  // [groups]
  int32_t* num_active = nullptr;
  int32_t* tile_group = nullptr;  // grouped-GEMM work list (moe_permute.h)
  int32_t* tile_row = nullptr;
  int32_t* num_tiles = nullptr;
  int32_t* sorted_token = nullptr;  // [P]
  float* sorted_weight = nullptr;
  int32_t* entry_row = nullptr;
  int32_t* permute_scratch = nullptr;  // [cuda::MoePermuteScratchInts(groups)]
  __nv_bfloat16* perm_bf16 = nullptr;  // [P][hidden]
  float* y = nullptr;                  // [P][hidden]
  float* logits = nullptr;             // [max_logit_rows][vocab]
  int32_t* argmax = nullptr;           // [max_logit_rows]
  void* argmax_scratch = nullptr;      // the LM head GEMV's fused arg-max (small_gemv.h)
  uint32_t* argmax_counter = nullptr;  // its block counter (zero between launches)
  uint32_t* route_counter = nullptr;   // MoeFusedRoute's block counter (zero between launches)
  uint32_t* down_tile_counters = nullptr;  // [hidden / 16] the ordered down sums' (zero between launches)
  DenseMlpPlan* dense_plan = nullptr;
  __nv_bfloat16* final_bf16 = nullptr;  // [max_logit_rows][hidden]
  // The FP8 decode path (LoadOptions::fp8_decode), sized for kSmallGemvMaxRows tokens:
  float* act_f32 = nullptr;  // [F inter] the dense MLP's SwiGLU outputs
  // The FP8 prefill path (LoadOptions::fp8_prefill): a GEMM's input quantized, e4m3
  // [R][k] and its scales [ceil(k / 128)][R], R = x_fp8_rows (the step's tokens or the MoE
  // layer's expert rows, whichever is more); null without that option.
  uint8_t* x_fp8 = nullptr;
  float* x_fp8_scales = nullptr;
  int64_t x_fp8_rows = 0;
};

}  // namespace cuda_model

class CudaDeepseekModel::Impl {
 public:
  ~Impl();

  // test: generated weights (host null) as the make-model --mtp-acceptance construction sets them.
  absl::Status Init(const ModelConfig& config, const ModelWeights* host, uint64_t seed, const LoadOptions& options,
                    const MtpTestWeights* test = nullptr);

  // Forward; with ids, *ids gets the argmax of each logits row instead of the logits, or
  // with sample also set, the token sampled from it.
  // With `launch`, a step of one logits pass returns once enqueued, its tokens copied later
  // by CollectLaunched (launched_ says where they land).
  absl::Status Run(std::span<const ForwardSequence> batch, const DeepseekForwardOptions& options, std::vector<float>* logits,
                   std::vector<int32_t>* ids, std::span<const CudaDeepseekModel::SampleRow> sample = {},
                   bool launch = false);
  absl::StatusOr<std::vector<int32_t>> CollectLaunched();
  // The launched step's tokens: `count` int32 at `host` once `done` has completed (not
  // set: the step ran to completion at launch, `tokens` holds its result).
  struct Launched {
    cudaEvent_t done = nullptr;
    const void* host = nullptr;
    int64_t count = 0;
    absl::StatusOr<std::vector<int32_t>> tokens = std::vector<int32_t>{};
  };
  std::optional<Launched> launched_;
  cudaEvent_t launch_event_ = nullptr;
  void DropGraphs();
  // A LoadOptions field changed after loading: the captured graphs baked the old value in.
  template <typename T>
  void SetOption(T CudaDeepseekModel::LoadOptions::*field, T value) {
    DropGraphs();
    options.*field = value;
  }

  // Speculative decoding (cuda_mtp.cc). After a forward pass (its plan): the final hidden
  // states of the keep_hidden sequences into kept_hidden_, and the MTP layer over the
  // slots of the sequences with `mtp` (then after_layer_kv of the MTP layer).
  absl::Status MtpAfterForward(std::span<const ForwardSequence> batch, const cuda_model::StepPlan& plan,
                               const DeepseekForwardOptions& fo);
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch);
  absl::StatusOr<std::vector<float>> KeptHidden(int64_t row);

  absl::Status ReadKv(int64_t layer, std::span<const int32_t> table, int64_t first, int64_t n, float* host);
  absl::Status WriteKv(int64_t layer, std::span<const int32_t> table, int64_t first, const float* entries, int64_t n);
  absl::StatusOr<uint64_t> LastForwardWeightBytes();

  ModelConfig config;
  LoadOptions options;
  std::string device_name;
  cudaStream_t stream = nullptr;
  int sm_count = 132;
  int64_t num_blocks = 0;
  int64_t max_context = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t max_table_rows = 0;
  int64_t max_logit_rows = 0;
  int64_t kv_layers = 0;  // layers of the KV cache: the decoder layers and, when loaded, the MTP layer
  uint64_t kv_bytes = 0;
  uint64_t activation_bytes = 0;
  std::unique_ptr<cuda_model::CudaModelWeights> weights;
  void* kv_cache_base() const { return kv_cache_.get(); }

 private:
  using DeviceMatrix = cuda_model::DeviceMatrix;
  enum class Out { kF32, kBf16, kAccumulate };

  absl::Status AllocateActivations();
  absl::Status AllocateKvCache();
  absl::StatusOr<cuda_model::StepPlan> Plan(std::span<const ForwardSequence> batch, AttentionForm form);
  // Everything of a step after the metadata upload: layers, final norm and LM head of
  // logits rows [0, min(out_rows, max_logit_rows)), argmax. Capturable when
  // plan.decode_only and no callback.
  absl::Status EnqueueStep(const cuda_model::StepPlan& plan, const DeepseekForwardOptions& options);
  absl::Status EnqueueLogits(const cuda_model::StepPlan& plan, int64_t begin, int64_t count);
  // gate_up then down through the expert GEMVs, each marked with its name.
  absl::Status ExpertProjections(const cuda::MoeExpertGemvParams& gate_up, const cuda::MoeExpertGemvParams& down,
                                 const char* gate_up_name, const char* down_name);
  // Whether EnqueueLogits(plan, begin, count) runs the LM head as SmallGemv (final norm
  // and arg-max fused), and whether it then leaves the arg-max in argmax_host_.
  bool LogitsByGemv(int64_t count) const;
  bool ArgmaxToHost(int64_t begin, int64_t count) const;
  absl::Status Attention(int64_t layer, const cuda_model::StepPlan& plan);
  absl::Status Mlp(int64_t layer, const cuda_model::StepPlan& plan);
  absl::Status FusedAttention(int64_t layer, const cuda_model::StepPlan& plan);
  absl::Status Moe(int64_t layer, const cuda_model::StepPlan& plan);
  // Whether a step multiplies the FP8 forms (LoadOptions::fp8_decode, fused decode steps).
  bool Fp8Decode(const cuda_model::StepPlan& plan) const;
  // What an FP8 product multiplies: x, or its rows' RMSNorm (norm_weight), or the SwiGLU of
  // its halves (swiglu; x [rows][2k]).
  struct Fp8Input {
    const float* x = nullptr;
    int64_t ldx = 0;
    const float* norm_weight = nullptr;
    float norm_eps = 0.0f;
    bool swiglu = false;
  };
  // `in` as the GEMV takes it (plain float32 rows): x itself, or made by RmsNorm (into
  // act_.h_f32) or ClampedSwiGlu without a clamp (into act_.act_f32).
  absl::StatusOr<Fp8Input> Fp8Activations(const Fp8Input& in, int64_t rows, int64_t k);
  // y (+)= in . w^T for `rows` rows (1..8), each of w's parts one QuantizedGemv.
  absl::Status Fp8Product(const cuda_model::Fp8Linear& w, const Fp8Input& in, int64_t rows, float* y, int64_t ldy,
                          bool accumulate, const char* what);
  // The dense MLP and the MoE layer of an Fp8Decode step (the FP8 forms present).
  absl::Status Fp8Mlp(int64_t layer, const cuda_model::StepPlan& plan);
  // The MoE layer's norm, router, routing and permutation as separate launches; then the
  // expert GEMMs (and the combine).
  absl::Status MoeFrontEnd(int64_t layer, const cuda_model::StepPlan& plan, const cuda::MoeRoutingParams& routing,
                           const cuda::MoePermuteParams& permute);
  // after_fused_route: the fused routing kernel came just before (early shared experts).
  absl::Status MoeExperts(int64_t layer, const cuda_model::StepPlan& plan, bool after_fused_route);
  // One cuBLAS GEMM per non-empty group (offsets: the host's copy of the group offsets),
  // spread over the side streams: y rows of group g = x rows of g . w_g^T, w_g at
  // w + g * w_group_stride ([n][k]).
  absl::Status ExpertGemmsByCublas(const std::vector<int32_t>& offsets, const __nv_bfloat16* x, int64_t k,
                                   const __nv_bfloat16* w, int64_t w_group_stride, float* y, int64_t n,
                                   const char* what);
  // y (+)= x . w^T for `rows` rows: the grouped kernel for small row counts, cuBLAS else.
  // With `fp8` (the layer's FP8 form) where UseFp8Gemm: that form on cuda::Fp8Gemm instead.
  absl::Status Dense(const DeviceMatrix& w, const __nv_bfloat16* x, const __nv_bfloat16* x_lo, int64_t ldx,
                     int64_t rows, void* y, int64_t ldy, Out out, const cuda_model::Fp8Linear* fp8 = nullptr);
  // Whether a step of `rows` tokens multiplies `w` on cuda::Fp8Gemm (LoadOptions::fp8_prefill).
  bool UseFp8Gemm(const cuda_model::Fp8Linear& w, int64_t rows) const;
  absl::Status DenseFp8(const cuda_model::Fp8Linear& w, const __nv_bfloat16* x, int64_t ldx, int64_t rows, void* y,
                        int64_t ldy, Out out);
  // x [rows][ldx] bf16 quantized into act_.x_fp8; the Fp8Gemm params with that input set
  // (a, its scales, m, k), the weights and output left to the caller.
  absl::StatusOr<cuda::Fp8GemmParams> QuantizeFp8Input(const __nv_bfloat16* x, int64_t ldx, int64_t rows, int64_t k);
  // The large-step MoE path's pieces shared by its bf16 and FP8 forms: the token rows in
  // permuted order into act_.perm_bf16; gate_up's outputs (act_.gu, interleaved) through
  // SiLU into act_.act_bf16.
  absl::Status GatherExpertRows(int64_t rows);
  absl::Status ExpertSiluMul(int64_t rows, int64_t inter);
  // A MoE layer's experts on the grouped cuda::Fp8Gemm (LoadOptions::fp8_prefill, steps
  // above moe_grouped_max_tokens): the permuted rows quantized, gate_up, SiLU, down into
  // act_.y for the combine, the expert offsets read on the device (no host round trip).
  absl::Status MoeExpertsFp8(int64_t layer, int64_t rows);
  absl::Status RunGraph(const cuda_model::StepPlan& plan, const DeepseekForwardOptions& options);
  // Whether a step takes the fused small-batch kernels (cuda_deepseek_model.h).
  bool Fused(const cuda_model::StepPlan& plan) const;
  // Whether absorbed jobs split their queries (LoadOptions::split_decode_queries, where the
  // model's decode kernel honours it: CudaAttentionWeights::w_uk).
  bool SplitQueries() const;
  // Whether the kAuto form runs a sequence of n new tokens after `start` cached ones
  // absorbed: with split queries, where that form needs fewer multiply-adds.
  bool AutoAbsorbed(int64_t n, int64_t start) const;
  // Uploads the sampling parameters of logits rows [begin, begin + count) and enqueues the
  // sampling kernel over act_.logits into act_.argmax.
  absl::Status EnqueueSample(std::span<const CudaDeepseekModel::SampleRow> rows, int64_t begin, int64_t count);

  // One sequence's rows of an MTP pass: slots [first_slot, first_slot + count); their
  // previous hidden states are the next `count` rows of mtp_in_ (sequences in order).
  struct MtpRows {
    int64_t first_slot = 0;
    int64_t count = 0;
    std::span<const int32_t> tokens;
    std::span<const int32_t> block_table;
  };
  // The MTP layer over `seqs` (its input hidden states in mtp_in_): leaves its output
  // (before the shared head's norm) in act_.x, rows in order.
  absl::Status MtpPass(std::span<const MtpRows> seqs, const DeepseekForwardOptions& fo);
  absl::Status AllocateMtpBuffers();  // once, at the first use
  // The shared head's draft for act_.x rows `rows` (host indices): tokens and confidences;
  // a row's non-empty mask (a constrained sequence's, DraftSequence::allowed) first.
  absl::StatusOr<std::vector<DraftToken>> MtpDrafts(std::span<const int32_t> rows,
                                                     std::span<const std::span<const uint32_t>> masks);
  absl::Status MaskDraftLogits(std::span<const std::span<const uint32_t>> masks);
  cuda_model::PinnedBuffer draft_mask_host_;
  cuda_model::DeviceBuffer draft_mask_dev_;
  cuda_model::DeviceBuffer kept_hidden_;  // [max_batch_tokens][hidden] float32
  int64_t kept_rows_ = 0;
  cuda_model::DeviceBuffer mtp_in_;       // [max_batch_tokens][hidden] float32
  cuda_model::DeviceBuffer mtp_both_;     // [max_batch_tokens][2 hidden] bf16, then its remainders
  cuda_model::DeviceBuffer draft_dev_;    // [max_logit_rows] tokens, then confidences
  cuda_model::PinnedBuffer draft_host_;

  __nv_bfloat16* KvLayer(int64_t layer) const {
    return kv_cache_.get<__nv_bfloat16>() + layer * num_blocks * 64 * config.kv_entry_dim();
  }

  cuda::CublasGemm gemm_;
  // Side streams for the per-expert cuBLAS GEMMs of steps above moe_grouped_max_tokens
  // (prefill chunks): the k-th non-empty expert's GEMM on side stream k % kSideStreams, each
  // with its own cuBLAS handle and workspace, so that the small GEMMs of the routed experts
  // (a few hundred rows, a fraction of the multiprocessors each) run side by side; forked
  // from and joined into `stream` with events (ExpertGemmsByCublas). Two: an 8K-token
  // prefill on the H200 took 118.3 / 119.1 ms with two, 120.8 / 120.4 with four, 123.7 /
  // 122.3 with eight (same run).
  static constexpr int kSideStreams = 2;
  cudaStream_t side_stream_[kSideStreams] = {};
  cudaEvent_t side_done_[kSideStreams] = {};
  cudaEvent_t side_fork_ = nullptr;
  cuda::CublasGemm side_gemm_[kSideStreams];
  cuda_model::DeviceBuffer inv_freq_;
  float rope_attention_factor_ = 1.0f;
  float softmax_scale_ = 1.0f;
  cuda_model::DeviceBuffer kv_cache_;
  cuda_model::DeviceBuffer act_buffer_;
  cuda_model::Activations act_;
  cuda_model::DeviceBuffer meta_dev_;
  cuda_model::PinnedBuffer meta_host_;
  cuda_model::PinnedBuffer logits_host_;
  cuda_model::PinnedBuffer small_host_;  // expert offsets, argmax ids
  // The greedy tokens of a step of a few rows, written by the LM head kernel itself into
  // mapped pinned memory (no copy after the step); argmax_host_dev_ is its device address
  // (null where the memory cannot be mapped: the copy then stays).
  cuda_model::PinnedBuffer argmax_host_;
  int32_t* argmax_host_dev_ = nullptr;
  cuda_model::DeviceBuffer kv_staging_;  // KV import/export
  cuda_model::PinnedBuffer kv_staging_host_;
  int64_t kv_staging_entries_ = 0;
  cuda_model::PinnedBuffer sample_host_;  // sampling rows + penalty entries of one chunk
  cuda_model::DeviceBuffer sample_dev_;
  int groups_ = 0;  // MoE groups (routed + shared), 0 without MoE layers
  int64_t moe_rows_ = 0;  // P: max_batch_tokens * (top_k + shared)
  // Graphs of decode steps, by (rows, context bucket, queries per sequence: 1 for decode
  // steps, 1 + drafts for speculative decoding's verify steps); seen once before capture.
  std::map<std::tuple<int64_t, int64_t, int64_t>, cudaGraphExec_t> graphs_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> graph_seen_;
  bool graphs_on_ = true;
  // Benchmark instrumentation (set_step_events, set_profiling).
  absl::Status Mark(const char* what);
  absl::Status RecordStepEnd(bool last);
  cudaEvent_t NextEvent();
  absl::StatusOr<std::vector<std::pair<double, double>>> TakeStepTimes();
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeProfile();
  bool step_events_ = false;
  std::vector<cudaEvent_t> step_begin_, step_end_;
  bool profiling_ = false;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
  std::vector<std::pair<std::string, double>> profile_;
  std::vector<cudaEvent_t> event_pool_;
  size_t events_used_ = 0;
  // Kernel timeline (set_kernel_timeline): a GPU timestamp after every marked launch of
  // the last eagerly enqueued step (kernels/cuda/timestamp.h), names by slot.
  static constexpr int kMaxStamps = 4096;
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeKernelTimeline();
  bool timeline_ = false;
  cuda_model::DeviceBuffer stamps_;
  std::vector<const char*> stamp_names_;
  // The last step's shape, for LastForwardWeightBytes.
  int64_t last_rows_ = 0;
  int64_t last_out_rows_ = 0;
  bool last_fp8_ = false;  // the last step multiplied the FP8 forms (Fp8Decode)
  int64_t fp8_gemms_ = 0;  // DenseFp8 calls (CudaDeepseekModel::fp8_gemms)

  friend class CudaDeepseekModel;
};

}  // namespace tandem
