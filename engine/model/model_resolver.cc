#include "engine/model/model_resolver.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/model_generator.h"
#include "engine/util/status_macros.h"

#ifndef TANDEM_DEFAULT_TOKENIZER_DIR
#define TANDEM_DEFAULT_TOKENIZER_DIR ""
#endif

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Bump when the generator's output changes, so stale cached models are not reused.
// 2: the generated tokenizer_config.json carries DeepSeek-V3's chat template.
constexpr int kGeneratorVersion = 2;

std::string CacheDir(const ModelResolverOptions& options) {
  if (!options.cache_dir.empty()) return options.cache_dir;
  if (const char* d = std::getenv("TANDEM_CACHE_DIR"); d != nullptr && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d) return absl::StrCat(d, "/tandem");
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) return absl::StrCat(h, "/.cache/tandem");
  return "/tmp/tandem-cache";
}

}  // namespace

std::string DefaultTokenizerDir() { return TANDEM_DEFAULT_TOKENIZER_DIR; }

absl::StatusOr<std::string> ResolveModelDir(const std::string& model, const ModelResolverOptions& options) {
  std::error_code ec;
  if (fs::exists(fs::path(model) / "config.json", ec)) return model;
  absl::StatusOr<std::string> preset = PresetConfig(model);
  if (!preset.ok()) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' is neither a checkpoint directory (with config.json) "
                                            "nor a built-in model (", preset.status().message(), ")"));
  }
  const std::string tokenizer_dir = options.tokenizer_dir.empty() ? DefaultTokenizerDir() : options.tokenizer_dir;
  const bool real_tokenizer = !tokenizer_dir.empty() && fs::exists(fs::path(tokenizer_dir) / "tokenizer.json", ec);
  const fs::path target = fs::path(CacheDir(options)) /
                          absl::StrFormat("%s-v%d-%s", model, kGeneratorVersion, real_tokenizer ? "ds3tok" : "bytetok");
  if (fs::exists(target / "config.json", ec)) return target.string();

  // Generate into a private directory and rename it into place, so concurrent first uses
  // (parallel tests) never see a half-written model.
  const fs::path tmp = fs::path(target.string() + absl::StrFormat(".tmp-%d", getpid()));
  fs::remove_all(tmp, ec);
  ModelGeneratorOptions gen;
  gen.config_json = *preset;
  gen.tokenizer_dir = real_tokenizer ? tokenizer_dir : "";
  ASSIGN_OR_RETURN(GeneratedModel generated, GenerateModel(gen, tmp.string()));
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (fs::exists(target / "config.json", ec)) return target.string();  // another process won
    return absl::InternalError(absl::StrCat("cannot move generated model into '", target.string(), "'"));
  }
  return target.string();
}

}  // namespace tandem
