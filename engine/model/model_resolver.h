// Turns a --model argument into a checkpoint directory: a path is used as is; a preset
// name ("tiny", "tiny-v2") names a built-in model, generated once into the cache
// directory and reused afterwards.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

struct ModelResolverOptions {
  // Where built-in models are generated; empty: $TANDEM_CACHE_DIR, else
  // $XDG_CACHE_HOME/tandem, else ~/.cache/tandem.
  std::string cache_dir;
  // DeepSeek-V3 tokenizer files for built-in models; empty: the copy installed by
  // scripts/install-deps.sh, when present.
  std::string tokenizer_dir;
};

// The directory DeepSeek-V3's tokenizer files are taken from by default.
std::string DefaultTokenizerDir();

// Errors: NOT_FOUND when `model` is neither a directory with config.json nor a preset.
absl::StatusOr<std::string> ResolveModelDir(const std::string& model, const ModelResolverOptions& options = {});

}  // namespace tandem
