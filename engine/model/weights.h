// The weights of a DeepSeek-V2/V3 model, as views into the mapped checkpoint where the
// stored type is used directly (BF16, F32, FP8 with block scales) and as owned float32
// copies where it is not (F16 matrices, every norm vector and bias). Loading checks every
// tensor's presence, shape and type against the config before anything runs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model_config.h"
#include "engine/model/parallel_layout.h"
#include "kernels/cpu/weight_matrix.h"

namespace tandem {

using cpu::WeightMatrix;

struct MlpWeights {
  WeightMatrix gate, up, down;
  // Under tensor parallelism (dense MLPs only) the rank's rows: gate and up rows
  // inter_split.begin(rank)..end(rank) (intermediate features), down rows of
  // hidden_split (output features, every intermediate column). Whole otherwise.
  RowSplit inter_split, hidden_split;
};

struct AttentionWeights {
  WeightMatrix q_proj;  // set when q_lora_rank is absent
  WeightMatrix q_a_proj;
  const float* q_a_norm = nullptr;
  WeightMatrix q_b_proj;
  WeightMatrix kv_a_proj;  // [kv_lora_rank + qk_rope_head_dim, hidden]
  const float* kv_a_norm = nullptr;
  WeightMatrix kv_b_proj;  // [heads * (qk_nope + v), kv_lora_rank]
  WeightMatrix o_proj;     // [hidden, heads * v]
};

struct MoeWeights {
  WeightMatrix router;                     // [experts, hidden], float32 (routing runs in fp32)
  const float* correction_bias = nullptr;  // e_score_correction_bias, or null
  // Every routed expert's slot; under expert parallelism only this rank's are loaded
  // (ParallelLayout::LocalExperts), the others stay empty.
  std::vector<MlpWeights> experts;
  std::optional<MlpWeights> shared;
};

struct DecoderLayerWeights {
  const float* input_norm = nullptr;
  const float* post_attention_norm = nullptr;
  AttentionWeights attention;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

// A multi-token-prediction module (DeepSeek-V3): combines the normalized embedding of the
// next token with the normalized last hidden state, then runs one decoder layer.
struct MtpLayerWeights {
  int64_t layer_index = 0;
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  WeightMatrix eh_proj;  // [hidden, 2 * hidden]
  DecoderLayerWeights block;
  const float* shared_head_norm = nullptr;
  WeightMatrix shared_head;  // lm head; may be absent (shares the main one)
  WeightMatrix embed;        // may be absent (shares the main one)
};

struct ModelWeights {
  WeightMatrix embed;  // [vocab, hidden]
  std::vector<DecoderLayerWeights> layers;
  const float* final_norm = nullptr;
  WeightMatrix lm_head;  // [vocab, hidden]; the embedding when tied
  RowSplit lm_head_split;  // under tensor parallelism the rank's vocabulary rows
  std::vector<MtpLayerWeights> mtp_layers;

  // Tensors of the checkpoint that no part of the model uses (reported, not fatal).
  std::vector<std::string> unused_tensors;
  uint64_t weight_bytes = 0;  // bytes of the tensors used
};

// Owns the checkpoint mapping and the converted buffers the views point into.
class LoadedWeights {
 public:
  // Errors: INVALID_ARGUMENT naming the tensor when one is missing, has the wrong shape or
  // an unusable type (e.g. FP8 without its weight_scale_inv), plus checkpoint errors.
  // With a parallel `layout` only the rank's part of the split tensors is used: the
  // others are checked (presence, shape) but neither converted nor read, so the mapped
  // pages of other ranks' experts never become resident.
  static absl::StatusOr<std::unique_ptr<LoadedWeights>> Load(const ModelConfig& config,
                                                             std::unique_ptr<Checkpoint> checkpoint,
                                                             const ParallelLayout& layout = {});
  const ModelWeights& weights() const { return weights_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }

 private:
  friend class WeightLoader;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
  ModelWeights weights_;
};

}  // namespace tandem
