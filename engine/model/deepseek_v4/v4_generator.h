// Writes deterministic random-weight DeepSeek-V4 checkpoints (`tandem make-model --preset
// tiny-v4`, or `--config` with a deepseek_v4 config.json), the V4 branch of
// engine/model/model_generator.h with the same options and the same guarantees
// (integer-only random numbers, byte-identical files everywhere).
//
// --dtype f32 / bf16 write the tensor names transformers' save_pretrained writes, so that
// transformers loads the checkpoint as it is (bf16 keeps transformers' fp32 modules --
// mHC, sinks, position biases, norms, the correction bias -- in float32, as it saves
// them); --dtype fp8 writes DeepSeek's official names and formats: FP8 e4m3 linear
// weights with 128x128 ue8m0 block scales, FP4 e2m1 routed experts with per-32 ue8m0
// scales, bf16 embeddings, norms, compressors and router, and the MTP layers (which
// transformers neither loads nor saves). Values transformers' default init leaves
// trivial are random: sinks, position biases, every norm, the mHC base and scale,
// tid2eid, the correction bias.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_generator.h"

namespace tandem::v4 {

// "tiny-v4": 4 layers (sliding, CSA, HCA, CSA; hash, hash, top-k, top-k MoE), 4 residual
// streams, window 16, CSA rate 4 with 8 indexer heads choosing 8 entries, HCA rate 16,
// YaRN on the compress table, swiglu_limit 1.5 (so the clamp acts), one MTP layer; as
// config.json text without vocab_size. Error: NOT_FOUND for another name.
absl::StatusOr<std::string> V4PresetConfig(const std::string& preset);
std::vector<std::string> V4PresetNames();

// Whether config.json text names model_type deepseek_v4 (false for anything unparsable).
bool IsDeepseekV4Config(std::string_view config_json);

// Writes the checkpoint into `dir` (created if needed; existing model files replaced).
// options.weight_dtype: kF32, kBF16 or kF8E4M3 (FP8 + FP4 experts). Errors:
// INVALID_ARGUMENT for a config the engine cannot run (named field), an unsupported dtype,
// write_weights = false, or mtp_acceptance set (a V3-only construction); file system errors.
absl::StatusOr<GeneratedModel> GenerateDeepseekV4Model(const ModelGeneratorOptions& options, const std::string& dir);

}  // namespace tandem::v4
