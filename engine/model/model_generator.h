// Writes deterministic random-weight checkpoints in Hugging Face format (config.json,
// safetensors, tokenizer.json, tokenizer_config.json): the built-in `tiny` models used by
// the demo and the tests, and models of real shapes for benchmarks. The same inputs give
// byte-identical files on every machine (integer-only random numbers, no timestamps).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"

namespace tandem {

struct ModelGeneratorOptions {
  // A Hugging Face config.json (JSON text) giving the architecture. vocab_size may be
  // omitted: it then follows the tokenizer.
  std::string config_json;
  uint64_t seed = 0;
  DType weight_dtype = DType::kBF16;  // kBF16, kF32 or kF8E4M3 (128x128 block scales)
  int num_shards = 1;                 // >1 writes model-0000i-of-0000n.safetensors + index
  // Directory holding DeepSeek-V3's tokenizer.json and tokenizer_config.json to copy; when
  // empty or absent, a byte-level BPE tokenizer is generated to fit vocab_size.
  std::string tokenizer_dir;
  // Vocabulary of the generated tokenizer when config_json gives no vocab_size.
  int64_t generated_vocab_size = 1024;
  // False: no weight files, only checkpoint.h's kGeneratedWeightsFile (bf16 only; the
  // CUDA backend generates the weights at load).
  bool write_weights = true;
  // Called after each tensor is written with (bytes written, total bytes); may be empty.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct GeneratedModel {
  std::string dir;
  std::string tokenizer;  // "deepseek-v3" or "generated-byte-level"
  int64_t num_parameters = 0;
  uint64_t weight_bytes = 0;
};

// The architectures of the presets ("tiny": deepseek_v3 with a dense layer, MoE layers of
// 8 experts in 2 groups, a shared expert, YaRN and an MTP layer; "tiny-v2": deepseek_v2
// without q_lora and with softmax group-limited routing), as config.json text without
// vocab_size. Error: NOT_FOUND for an unknown preset.
absl::StatusOr<std::string> PresetConfig(const std::string& preset);
std::vector<std::string> PresetNames();

// Writes the checkpoint into `dir` (created if needed; existing model files replaced).
// Errors: INVALID_ARGUMENT for a config the engine cannot run (named field) or an
// unsupported dtype; file system errors.
absl::StatusOr<GeneratedModel> GenerateModel(const ModelGeneratorOptions& options, const std::string& dir);

}  // namespace tandem
