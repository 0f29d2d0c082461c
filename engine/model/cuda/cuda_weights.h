// The weights of a DeepSeek-V2/V3 model on the GPU, in the layouts the CUDA forward pass
// reads (bf16 matrices, float32 norms and router):
//   - attention: [q_proj | kv_a_proj] (or [q_a_proj | kv_a_proj]) stacked into one matrix,
//     one GEMM for both; kv_b_proj as stored (per head [nope rows | v rows]: the absorbed
//     form's W_UK and W_UV) and split ([all heads' nope rows | all heads' v rows]: the
//     expanded form's keys and values as two contiguous column ranges);
//   - MLPs: gate_up with gate and up rows interleaved in blocks of 8 (one GEMM, SiLU fused
//     into its epilogue), down as stored;
//   - MoE: the routed experts then the shared experts split into n_shared experts of
//     moe_intermediate_size each (an MLP of intermediate a + b is the sum of two MLPs), all
//     in one [groups][...] tensor per projection, so one grouped GEMM runs them all.
// Loaded from a checkpoint's LoadedWeights (BF16 copied, F32 and block-scaled FP8
// converted on the GPU) or generated on the GPU with the values `tandem make-model`
// writes for a seed (random_init.h).
//
// FP8 checkpoints (block-scaled E4M3, DeepSeek-V3's layout) also keep the linears' stored
// form (with `fp8_forms`): codes and 128x128 block scales as in the checkpoint, for the
// decode steps' matrix-vector products (cuda::QuantizedGemv reads a byte a weight instead
// of the bf16 copy's two). The bf16 copies stay for the larger steps' GEMMs, so such a
// model takes 1.5x the memory of its checkpoint. Generated with an FP8 config, the
// make-model values are quantized on the GPU as make-model quantizes them and the bf16
// copies are their dequantization (what loading that checkpoint gives).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "kernels/cuda/quantized_gemv.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace tandem {
class MtpTestWeights;
}  // namespace tandem

namespace tandem::cuda_model {

inline constexpr int kGateUpInterleave = 8;
// Absorbed-form queries split into bf16 value + remainder (MlaDecodeParams::q_lo) for models
// of at most this many heads whose decode kernel honours them (cuda::MlaDecodeSplitsQueries):
// the split doubles the attention's row tiles, cheap only while few rows share the KV reads.
inline constexpr int64_t kSplitQueryMaxHeads = 32;

struct DeviceMatrix {
  __nv_bfloat16* data = nullptr;  // [rows][cols]
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t bytes() const { return static_cast<uint64_t>(rows * cols) * 2; }
};

// One matrix in FP8 with its block scales (cuda::QuantizedGemv's kFp8Block128 form).
struct Fp8Matrix {
  const uint8_t* codes = nullptr;  // [rows][cols] E4M3
  const float* scales = nullptr;   // [ceil(rows / 128)][ceil(cols / 128)]
  int64_t rows = 0;
  int64_t cols = 0;
};

// A linear layer's FP8 form: consecutive parts along the output rows, each one product
// (the checkpoint's tensors stacked as the bf16 copy stacks them, e.g. qkv_a's q then
// kv_a; one part when every part but the last has a multiple of 128 rows, so that the
// stacked scales index as one matrix's). Empty: the layer has no FP8 form.
struct Fp8Linear {
  std::vector<Fp8Matrix> parts;
  bool present() const { return !parts.empty(); }
};

// A MoE layer's experts in FP8 for the routed GEMV (the routed experts, then the shared
// experts split into n_shared experts of moe_intermediate_size each, as the bf16 groups).
// A MoE layer's experts (routed, then shared) in FP8 as cuda::MoeExpertGemv reads them
// (MoeExpertGemvParams::b_fp8): gate_up interleaved in blocks of kGateUpInterleave rows as
// the bf16 groups, the checkpoint's 128 x 128 block scales expanded to rows.
struct Fp8Experts {
  const uint8_t* gate_up_interleaved = nullptr;  // [groups][2 * inter][hidden]
  const float* gate_up_row_scales = nullptr;     // [groups][2 * inter][ceil(hidden / 128)]
  const uint8_t* down_codes = nullptr;           // [groups][hidden][inter]
  const float* down_row_scales = nullptr;        // [groups][hidden][inter / 128]
};

struct CudaAttentionWeights {
  DeviceMatrix qkv_a;  // [q_dim + kv_lora_rank + rope][hidden], q_dim = q_lora_rank or heads * qk
  const float* q_a_norm = nullptr;
  DeviceMatrix q_b;  // [heads * qk][q_lora_rank] (q_lora models)
  const float* kv_a_norm = nullptr;
  DeviceMatrix kv_b;        // [heads * (nope + v)][kv_lora_rank], as stored
  DeviceMatrix kv_b_split;  // [heads * nope + heads * v][kv_lora_rank]
  const float* w_uv = nullptr;  // [heads][v][kv_lora_rank] float32: kv_b's value rows (absorbed form)
  // [heads][nope][kv_lora_rank] float32: kv_b's key rows, for split absorbed queries (models
  // of at most kSplitQueryMaxHeads heads whose decode kernel splits queries; else null).
  const float* w_uk = nullptr;
  DeviceMatrix o_proj;      // [hidden][heads * v]
  Fp8Linear qkv_a_fp8;       // FP8 forms (fp8_forms; empty otherwise)
  Fp8Linear q_b_fp8;
  Fp8Linear o_proj_fp8;
};

struct CudaMlpWeights {
  DeviceMatrix gate_up;  // [2 * inter][hidden], interleaved by kGateUpInterleave
  DeviceMatrix down;     // [hidden][inter]
  Fp8Linear gate_up_fp8;  // gate rows then up rows (not interleaved)
  Fp8Linear down_fp8;
};

struct CudaMoeWeights {
  const float* router = nullptr;           // [experts][hidden] float32
  const float* correction_bias = nullptr;  // [experts] or null
  int groups = 0;                          // routed + split shared experts
  int64_t inter = 0;                       // moe_intermediate_size
  __nv_bfloat16* gate_up = nullptr;        // [groups][2 * inter][hidden], interleaved
  __nv_bfloat16* down = nullptr;           // [groups][hidden][inter]
  // FP8 forms (fp8_forms, every expert tensor FP8, moe_intermediate_size a multiple of
  // 128 so that the shared experts split on scale blocks); null otherwise.
  std::optional<Fp8Experts> fp8;
};

struct CudaLayerWeights {
  const float* input_norm = nullptr;
  const float* post_attention_norm = nullptr;
  CudaAttentionWeights attention;
  std::optional<CudaMlpWeights> mlp;
  std::optional<CudaMoeWeights> moe;
};

// The MTP layer's own weights (speculative decoding, docs/speculative-decoding.md); its
// decoder block is CudaModelWeights::layers[num_hidden_layers].
struct CudaMtpWeights {
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  DeviceMatrix eh_proj;  // [hidden][2 * hidden]: [embedding half | hidden-state half]
  const float* shared_head_norm = nullptr;
  DeviceMatrix shared_head;  // [vocab][hidden]; the LM head when the checkpoint has none
  DeviceMatrix embed;        // [vocab][hidden]; the embedding when the checkpoint has none
};

struct CudaModelWeights {
  DeviceMatrix embed;    // [vocab][hidden]
  DeviceMatrix lm_head;  // [vocab][hidden]; the embedding when tied
  const float* final_norm = nullptr;
  std::vector<CudaLayerWeights> layers;  // the decoder layers, then the MTP layer's block when loaded
  std::optional<CudaMtpWeights> mtp;
  uint64_t bytes = 0;  // GPU bytes of all weights
  uint64_t fp8_bytes = 0;  // of which the FP8 forms (codes and scales)
  int64_t fp8_linears = 0;  // linear layers (or MoE layers' expert sets) with an FP8 form
  std::vector<DeviceBuffer> buffers;
};

// host == nullptr: generate the weights make-model would write with `seed` (bf16), with
// `test` the make-model --mtp-acceptance construction's (engine/model/mtp_test_model.h).
// mtp: also the first MTP layer (FAILED_PRECONDITION when the checkpoint has none).
// fp8_forms: keep FP8 tensors' stored form too (above); generated: when the config says
// FP8 (quantization_config fp8).
// Errors: RESOURCE_EXHAUSTED when the GPU lacks memory, INTERNAL for CUDA failures.
absl::StatusOr<std::unique_ptr<CudaModelWeights>> UploadWeights(const ModelConfig& config, const ModelWeights* host,
                                                                uint64_t seed, cudaStream_t stream, bool mtp = false,
                                                                const MtpTestWeights* test = nullptr,
                                                                bool fp8_forms = false);

}  // namespace tandem::cuda_model
