#include "engine/architectures/architectures.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {

const std::vector<Architecture>& Architectures() {
  static const std::vector<Architecture>* all = new std::vector<Architecture>{
      {.model_type = "deepseek_v2", .load = LoadDeepseekBackend},
      {.model_type = "deepseek_v3", .load = LoadDeepseekBackend},
      // Computed exactly on the CPU (engine/model/deepseek_v4, checked against
      // transformers), not yet servable: the engine's KV pool holds one latent stream
      // (docs/model-neutral-engine.md).
      {.model_type = "deepseek_v4",
       .load = [](const std::string&, const BackendOptions&) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
         return absl::UnimplementedError(
             "config.json: model_type 'deepseek_v4' is not servable yet: the engine's KV pool cannot hold its "
             "streams (docs/model-neutral-engine.md)");
       }},
  };
  return *all;
}

absl::StatusOr<std::string> ReadModelType(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  auto it = config.find("model_type");
  if (it == config.end()) return absl::InvalidArgumentError("config.json: field 'model_type' is required");
  if (!it->is_string()) return absl::InvalidArgumentError("config.json: field 'model_type' must be a string");
  return it->get<std::string>();
}

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadModelBackend(const std::string& dir, const BackendOptions& options) {
  ASSIGN_OR_RETURN(const std::string model_type, ReadModelType(dir));
  std::vector<std::string> known;
  for (const Architecture& a : Architectures()) {
    if (a.model_type == model_type) return a.load(dir, options);
    known.push_back(a.model_type);
  }
  return absl::InvalidArgumentError(absl::StrCat("config.json: field 'model_type' is '", model_type,
                                                 "'; supported: ", absl::StrJoin(known, ", ")));
}

}  // namespace tandem
