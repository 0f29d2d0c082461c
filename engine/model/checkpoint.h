// A Hugging Face checkpoint directory: config.json plus either one `model.safetensors` or
// shards listed in `model.safetensors.index.json`. Gives every tensor by name, with the
// shard files kept mapped for the checkpoint's lifetime.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/safetensors.h"

namespace tandem {

// A benchmark checkpoint without weight files (`tandem make-model --weights-on-gpu`):
// config.json, the tokenizer and this file, {"seed": N}; the CUDA backend generates the
// weights make-model would have written with that seed (bf16, bit-identical) on the GPU
// at load, so that models of real sizes need not be written and read.
inline constexpr char kGeneratedWeightsFile[] = "tandem_generated_weights.json";

// Reads a sharded checkpoint's model.safetensors.index.json: tensor name -> shard file
// name, each shard a plain file name in the checkpoint's directory (checked).
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index_file);

class Checkpoint {
 public:
  // Errors: NOT_FOUND (no safetensors files), INVALID_ARGUMENT (malformed index, a tensor
  // in two shards, an index entry naming a tensor its shard lacks), and every error of
  // SafetensorsFile::Open.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir,
                                                          AcceptedDTypes accepted = AcceptedDTypes::kFloatWeights);

  const std::string& dir() const { return dir_; }
  // nullptr if absent.
  const TensorView* Find(const std::string& name) const;
  const std::map<std::string, const TensorView*>& tensors() const { return index_; }
  size_t num_files() const { return files_.size(); }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace tandem
