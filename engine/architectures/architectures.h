// The model architectures this build serves, by config.json's `model_type`, each with
// the loaders of its backends (cpu, cuda). Adding an architecture is its own directory
// (engine/model/<name>/) plus one entry in architectures.cc; the engine finds the
// backend here and knows nothing else of the model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/kv_streams.h"
#include "engine/model/model_backend.h"

namespace tandem {

// What the KV of a model holds beyond its decoder layers'.
struct KvStreamOptions {
  // Speculative decoding with the checkpoint's MTP layer (docs/speculative-decoding.md):
  // its KV as one more layer after the decoder layers.
  bool mtp = false;
};

struct Architecture {
  std::string model_type;  // config.json's
  // Loads a checkpoint directory of this architecture on options.device; an empty
  // loader, or one answering UNIMPLEMENTED, means the architecture is known but not
  // servable yet (its message says why).
  std::function<absl::StatusOr<std::unique_ptr<ModelBackend>>(const std::string& dir, const BackendOptions& options)>
      load;
  // The KV streams a config.json of this architecture gives each sequence (validated by
  // the caller); errors name the config field, or say what the options ask that the
  // architecture cannot give.
  std::function<absl::StatusOr<ModelKvStreams>(std::string_view config_json, const KvStreamOptions& options)>
      kv_streams;
  // What every model has (vocabulary, context, special tokens) from a config.json of
  // this architecture, without weights: what a router needs.
  std::function<absl::StatusOr<ModelInfo>(std::string_view config_json)> info;
};

// Every architecture this build knows, in registration order.
const std::vector<Architecture>& Architectures();

// config.json's model_type in `dir`. Errors: NOT_FOUND without config.json,
// INVALID_ARGUMENT "config.json: ..." for malformed JSON or a missing or non-string field.
absl::StatusOr<std::string> ReadModelType(const std::string& dir);
// The same from config.json's text.
absl::StatusOr<std::string> ModelTypeOfConfig(std::string_view config_json);

// The KV streams of `config_json` by its model_type, validated for blocks of
// `block_size` tokens. Errors: as ReadModelType and LoadModelBackend for the model_type,
// the architecture's for its fields.
absl::StatusOr<ModelKvStreams> KvStreamsForConfig(std::string_view config_json, int32_t block_size,
                                                  const KvStreamOptions& options = {});

// ModelInfo of the checkpoint in `dir` from its config.json alone, by its model_type.
// Errors: as ReadModelType and LoadModelBackend for the model_type, the architecture's
// for its fields.
absl::StatusOr<ModelInfo> LoadModelInfo(const std::string& dir);

// The backend for the checkpoint in `dir`, by its model_type. Errors: INVALID_ARGUMENT
// "config.json: field 'model_type' is 'X'; supported: ..." for an architecture this
// build does not know; the loader's own errors otherwise.
absl::StatusOr<std::unique_ptr<ModelBackend>> LoadModelBackend(const std::string& dir, const BackendOptions& options);

}  // namespace tandem
