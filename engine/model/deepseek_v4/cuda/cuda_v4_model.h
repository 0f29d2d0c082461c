// DeepSeek-V4's forward pass on an NVIDIA GPU (issue 22), first form: the CPU engine's
// arithmetic (v4_model.h, v4_paged_model.h) in float32 throughout, batched over every
// token of every sequence of a pass, with each sequence's state (sliding-window ring,
// compressors' unfinished windows, compressed entries and indexer keys) in a GPU KV pool
// of the same layout as the engine's host pool (v4_kv_streams.h, kv_pool.h). The pass's
// addresses are planned on the host (cuda_v4_plan.h); the layers run as cuBLAS GEMMs
// (float32, no TF32) and the V4 kernels of kernels/cuda. The logits therefore differ from
// the CPU engine's only by the order of float sums.
//
// FP8 matrices, FP4 experts and bf16 matrices stay narrow (cuda_v4_weights.h). Passes of
// up to 64 token-expert pairs on narrow experts route on the device and, with
// Options::cuda_graphs, replay from a captured CUDA graph: one per launch layout (rows,
// the plan's array sizes, the buckets of the compressed entries' counts), the first pass
// of a layout run eagerly, the second captured. Not yet: speculative decoding (the MTP
// layer), sampling on the GPU, and the MoE layer of larger passes (or float32 experts)
// without a host round trip (their experts' row counts are read back each layer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_plan.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_weights.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "engine/model/forward_batch.h"
#include "engine/model/kv_pool.h"
#include "kernels/cuda/cublas_gemm.h"

namespace tandem::v4::cuda_v4 {

class CudaV4Model {
 public:
  struct Options {
    int device = 0;
    bool cuda_graphs = true;  // replay decode-sized passes from captured graphs
    // Run the shared expert beside the routing and the routed experts (a second stream)
    // where its products are narrow GEMVs; off: after them on the one stream (tests).
    bool shared_expert_beside = true;
    // Passes of at least kFp8GemmMinRows rows multiply the FP8 matrices on the FP8 tensor
    // cores (cuda::Fp8Gemm, sm_90 only): each product's activations quantized per row and
    // 128 columns as DeepSeek's inference code does (act_quant), the sums promoted to
    // float32 per 128-wide block. Off: those matrices widened to float32 for cuBLAS's
    // float32 GEMM, the CPU engine's arithmetic. The CPU reference with the same rounding:
    // DeepseekV4Model::LoadOptions::fp8_activation_rounding.
    bool fp8_gemm = false;
  };
  static constexpr int64_t kFp8GemmMinRows = 128;
  // Loads config.json and the weights of `dir` onto the GPU. Errors: the loaders'
  // (config, weights); FAILED_PRECONDITION for a device that does not exist;
  // RESOURCE_EXHAUSTED when the GPU lacks memory.
  static absl::StatusOr<std::unique_ptr<CudaV4Model>> Load(const std::string& dir, const Options& options);
  // The same from weights already in memory (`weights` need not outlive the call).
  static absl::StatusOr<std::unique_ptr<CudaV4Model>> Create(const DeepseekV4Config& config,
                                                             const ModelWeights& weights, const Options& options);
  ~CudaV4Model();

  const DeepseekV4Config& config() const { return config_; }
  std::vector<KvStream> kv_streams() const;
  uint64_t weight_bytes() const { return weights_->bytes; }
  int64_t fp8_matrices() const { return weights_->fp8_matrices; }
  int64_t fp4_matrices() const { return weights_->fp4_matrices; }
  int64_t bf16_matrices() const { return weights_->bf16_matrices; }
  // Passes replayed from a graph so far (tests; the benchmark's report).
  int64_t graph_replays() const { return graph_replays_; }
  // Layers whose shared expert was enqueued beside the routed experts so far (tests).
  int64_t shared_expert_branches() const { return shared_expert_branches_; }
  // Products run on cuda::Fp8Gemm so far (Options::fp8_gemm; tests, the benchmark).
  int64_t fp8_gemms() const { return fp8_gemms_; }
  void set_cuda_graphs(bool on) { graphs_on_ = on; }
  void set_fp8_gemm(bool on) { fp8_gemm_on_ = on; }  // Options::fp8_gemm, from the next pass

  // The GPU pool, of this model's streams and geometry `g` (a host pool's, so that block
  // ids and state slots mean the same in both): allocated and zeroed at the first call,
  // again when `g` changes.
  absl::Status EnsurePool(const KvPool::Geometry& g);
  KvPool* pool() { return pool_.get(); }
  int device() const { return device_; }
  // The stream every pass runs on (a cudaStream_t): what reads the pool after a pass
  // goes on it too.
  void* stream() const { return stream_; }

  // PagedV4Model::Forward's contract over the GPU pool (EnsurePool first). Speculative
  // decoding's fields (mtp, keep_hidden, first_kv_cached, num_drafts) are UNIMPLEMENTED.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch,
                                             const ForwardOptions& options = {});

  // The whole GPU pool copied into `host`, a pool of the same streams and geometry (tests
  // compare the state with the CPU engine's).
  absl::Status CopyPoolTo(KvPool& host);
  // Ranges of the pool (offsets from its first byte) to or from the same ranges of `host`
  // (ModelBackend::PoolRangesToHost), and one state slot over another (CopyStateSlot).
  // INVALID_ARGUMENT for ranges outside the pool or a host pool of another size.
  absl::Status CopyRanges(std::span<const KvExtent> ranges, KvPool& host, bool to_host);
  absl::Status CopyStateSlot(int64_t from, int64_t to);

 private:
  CudaV4Model() = default;
  absl::Status Check(std::span<const ForwardSequence> batch) const;
  struct PassShape {
    int64_t rows = 0, logits_rows = 0, max_entries_csa = 0, max_entries_hca = 0;
  };
  absl::Status Allocate(const PassShape& shape);  // the activations
  absl::Status Stage(const StepPlan& plan);        // the plan's arrays onto the device
  absl::Status Block(int64_t layer);
  absl::Status HyperPre(const HyperSite& site, const float* norm);
  absl::Status Attention(int64_t layer);
  absl::Status Moe(int64_t layer);
  absl::Status RoutedOnDevice(int64_t layer);
  absl::Status SharedExpertAndCombine(int64_t layer, const float* const* routed);
  // The shared expert into Step::sub on `stream` when its products are narrow GEMVs (no
  // shared scratch: it may run beside the routed experts); false when it is not.
  bool SharedExpertBeside(int64_t layer) const;
  absl::Status SharedExpert(int64_t layer, cudaStream_t stream);
  absl::Status EnqueuePass();  // the embedding, the layers and the logits rows, on the stream
  absl::Status RunGraph();
  void DropGraphs();
  absl::Status EnqueueLogits();
  absl::Status Linear(const float* x, int64_t ldx, const DeviceMatrix& w, float* y, int64_t ldy, int64_t m);
  // Options::fp8_gemm (cuda_v4_fp8_gemm.cc): the quantized activations' scratch for a pass
  // of `rows` rows, and Linear's FP8 GEMM (false: the operands do not meet its alignment
  // needs, and Linear widens instead).
  absl::Status EnsureFp8Scratch(int64_t rows);
  absl::StatusOr<bool> Fp8GemmLinear(const float* x, int64_t ldx, const DeviceMatrix& w, float* y, int64_t ldy,
                                     int64_t m);

  DeepseekV4Config config_;
  std::unique_ptr<CudaV4Weights> weights_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  // A second stream for work that may run beside the main chain (the shared expert beside
  // the routing and the routed experts), forked from and joined back to stream_ with these
  // events: a parallel branch of a captured graph.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  cuda::CublasGemm gemm_;
  const float* main_inv_freq_ = nullptr;
  const float* compress_inv_freq_ = nullptr;
  std::vector<cuda_model::DeviceBuffer> constants_;
  cuda_model::DeviceBuffer widened_;  // slabs of a narrow matrix widened for a GEMM
  int64_t widened_elements_ = 0;

  cuda_model::DeviceBuffer pool_memory_;
  std::unique_ptr<KvPool> pool_;

  bool graphs_on_ = true;
  std::map<std::vector<int64_t>, cudaGraphExec_t> graphs_;  // by launch layout (Step::GraphKey)
  std::map<std::vector<int64_t>, int> graph_seen_;
  int64_t graph_replays_ = 0;
  bool shared_beside_on_ = true;
  int64_t shared_expert_branches_ = 0;
  bool fp8_gemm_on_ = false;  // Options::fp8_gemm
  bool fp8_pass_ = false;     // this pass's FP8 products on Fp8Gemm
  cuda_model::DeviceBuffer fp8_scratch_;  // quantized activations, then their scales
  int64_t fp8_scratch_rows_ = 0, fp8_scratch_cols_ = 0;
  int64_t fp8_gemms_ = 0;

  // Per pass: the plan, its arrays on the device, and the activations.
  struct Step;
  std::unique_ptr<Step> step_;
};

}  // namespace tandem::v4::cuda_v4
