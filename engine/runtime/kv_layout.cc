#include "engine/runtime/kv_layout.h"

#include "absl/strings/str_format.h"
#include "engine/model/latent_kv_cache.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "xxhash.h"

namespace tandem {

KvLayout KvLayoutFor(const ModelConfig& c, const std::string& config_json_text) {
  return KvLayout{.model_id = absl::StrFormat("%s:%016x", c.model_type,
                                              XXH64(config_json_text.data(), config_json_text.size(), 0)),
                  .dtype = "f32",
                  .block_size = static_cast<int32_t>(kKvBlockSize),
                  .entry_dim = static_cast<int32_t>(c.kv_entry_dim()),
                  .num_layers = static_cast<int32_t>(c.num_hidden_layers),
                  .layout_version = kKvLayoutVersion};
}

absl::StatusOr<KvLayout> KvLayoutForModel(const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(model_dir + "/config.json"));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text));
  return KvLayoutFor(config, text);
}

}  // namespace tandem
