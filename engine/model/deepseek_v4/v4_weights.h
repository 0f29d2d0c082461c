// The weights of a DeepSeek-V4 model, resolved against a checkpoint under any of the
// namings of v4_tensor_names.h and checked (presence, shape, type) against the config
// before anything runs. Matrices are views of the mapped checkpoint where the stored type
// is read directly (BF16, F32, FP8 e4m3 with 128x128 block scales, their ue8m0 or float
// scales converted to float); FP4 e2m1 routed experts (two a byte, low nibble first, one
// ue8m0 scale per 32 along the input) are dequantized at load into bf16, which holds
// every such value exactly. Vectors (norms, biases, sinks, position biases, mHC
// parameters) are owned float32 copies.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_tensor_names.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem::v4 {

using cpu::WeightMatrix;

// One mHC site (attn_hc / ffn_hc): fn [(2+N)N, N*D], base [(2+N)N], scale [3].
struct HyperConnectionWeights {
  WeightMatrix fn;
  const float* base = nullptr;
  const float* scale = nullptr;
};

// The final collapse of the streams: fn [N, N*D], base [N], scale [1].
struct HyperHeadWeights {
  WeightMatrix fn;
  const float* base = nullptr;
  const float* scale = nullptr;
};

// A gated pooling of windows into compressed entries. CSA and the indexer project to
// twice the entry width (the two overlapping series), HCA to the entry width.
struct CompressorWeights {
  WeightMatrix kv_proj;                  // [proj_width, D]
  WeightMatrix gate_proj;                // [proj_width, D]
  const float* position_bias = nullptr;  // [rate, proj_width]
  const float* norm = nullptr;           // [entry width]
};

struct IndexerWeights {
  CompressorWeights compressor;  // entries of index_head_dim
  WeightMatrix q_b_proj;         // [index_n_heads * index_head_dim, q_lora_rank]
  WeightMatrix weights_proj;     // [index_n_heads, D]
};

struct AttentionWeights {
  WeightMatrix q_a_proj;  // [q_lora_rank, D]
  const float* q_a_norm = nullptr;
  WeightMatrix q_b_proj;  // [H * d, q_lora_rank]
  WeightMatrix kv_proj;   // [d, D]
  const float* kv_norm = nullptr;
  std::vector<WeightMatrix> o_a_groups;  // o_groups blocks of o_a_proj, each [R, H * d / G]
  WeightMatrix o_b_proj;                 // [D, G * R]
  const float* sinks = nullptr;          // [H]
  std::optional<CompressorWeights> compressor;  // CSA and HCA layers
  std::optional<IndexerWeights> indexer;        // CSA layers
};

// The clamped SwiGLU: down(silu(min(gate x, L)) * clamp(up x, -L, L)); official w1, w3, w2.
struct ExpertWeights {
  WeightMatrix gate;  // [I, D]
  WeightMatrix up;    // [I, D]
  WeightMatrix down;  // [D, I]
};

struct MoeWeights {
  WeightMatrix router;                     // [E, D]
  const float* correction_bias = nullptr;  // [E], top-k layers
  const int32_t* tid2eid = nullptr;        // [vocab][K], hash layers
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // input_layernorm
  const float* ffn_norm = nullptr;   // post_attention_layernorm
  HyperConnectionWeights attn_hc, ffn_hc;
  AttentionWeights attention;
  MoeWeights moe;
};

// A multi-token-prediction layer (official mtp.J.*): loaded and reported; the forward
// pass does not use it.
struct MtpWeights {
  WeightMatrix e_proj, h_proj;  // [D, D]
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  const float* norm = nullptr;
  HyperHeadWeights hc_head;
  LayerWeights block;
  std::vector<std::string> tensors;  // the names it was loaded from
};

struct ModelWeights {
  TensorNaming naming = TensorNaming::kOfficial;
  WeightMatrix embed;  // [vocab, D]
  WeightMatrix head;   // [vocab, D]; the embedding when tied
  const float* norm = nullptr;
  HyperHeadWeights hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;

  // How the matrices were stored, counted per tensor.
  int64_t fp8_matrices = 0;
  int64_t fp4_matrices = 0;
  // Tensors of the checkpoint that no part of the model uses (reported, not fatal).
  std::vector<std::string> unused_tensors;
  uint64_t weight_bytes = 0;  // bytes of the tensors used
};

// Owns the checkpoint mapping and the converted buffers the views point into.
class LoadedWeights {
 public:
  // Errors: INVALID_ARGUMENT naming the tensor when one is missing, has the wrong shape or
  // an unusable type, an FP8 or FP4 weight lacks its scales, a scale is NaN or a tid2eid
  // entry names no expert; NOT_FOUND/INVALID_ARGUMENT when the names are of no known kind;
  // plus checkpoint errors.
  static absl::StatusOr<std::unique_ptr<LoadedWeights>> Load(const DeepseekV4Config& config,
                                                             std::unique_ptr<Checkpoint> checkpoint);
  // Opens `dir` (config.json must already be parsed into `config`).
  static absl::StatusOr<std::unique_ptr<LoadedWeights>> Load(const DeepseekV4Config& config, const std::string& dir);

  const ModelWeights& weights() const { return weights_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }

 private:
  friend class WeightResolver;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_f32_;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> owned_bf16_;
  std::vector<std::unique_ptr<std::vector<int32_t>>> owned_i32_;
  ModelWeights weights_;
};

// FP4 e2m1 code (low 4 bits) to its value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives.
float Fp4E2m1ToF32(uint8_t code);

}  // namespace tandem::v4
