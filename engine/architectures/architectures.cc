#include "engine/architectures/architectures.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/deepseek_v4/v4_backend.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/model_config.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// DeepSeek-V2/V3: one latent entry (kv_lora_rank + qk_rope_head_dim floats) per token on
// every layer, and on the MTP layer after them when it drafts.
absl::StatusOr<ModelKvStreams> DeepseekLatentStreams(std::string_view config_json, const KvStreamOptions& options) {
  ASSIGN_OR_RETURN(const ModelConfig c, ParseModelConfig(config_json));
  if (options.mtp && c.num_nextn_predict_layers < 1) {
    return absl::FailedPreconditionError(
        "speculative decoding needs the checkpoint's MTP layer: config.json's num_nextn_predict_layers is 0");
  }
  ModelKvStreams out{.num_layers = static_cast<int32_t>(c.num_hidden_layers + (options.mtp ? 1 : 0))};
  KvStream latent{.name = "latent", .dtype = "f32", .granularity = KvGranularity::kPerToken, .tokens = 1,
                  .width = static_cast<int32_t>(c.kv_entry_dim())};
  for (int32_t l = 0; l < out.num_layers; ++l) latent.layers.push_back(l);
  out.streams.push_back(std::move(latent));
  return out;
}

absl::StatusOr<ModelKvStreams> DeepseekV4Streams(std::string_view config_json, const KvStreamOptions& options) {
  ASSIGN_OR_RETURN(const v4::DeepseekV4Config c, v4::ParseDeepseekV4Config(config_json));
  if (options.mtp && c.num_nextn_predict_layers < 1) {
    return absl::FailedPreconditionError(
        "speculative decoding needs the checkpoint's MTP layer: config.json's num_nextn_predict_layers is 0");
  }
  if (options.mtp && c.mtp_attention_type != v4::AttentionType::kSliding) {
    return absl::UnimplementedError(absl::StrCat("speculative decoding with an MTP layer of ",
                                                 v4::AttentionTypeName(c.mtp_attention_type),
                                                 " attention (only a sliding-window MTP layer is built)"));
  }
  return ModelKvStreams{.num_layers = static_cast<int32_t>(c.num_hidden_layers + (options.mtp ? 1 : 0)),
                        .streams = v4::KvStreamsFor(c, options.mtp)};
}

absl::StatusOr<ModelInfo> DeepseekInfo(std::string_view config_json) {
  ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_json));
  return static_cast<ModelInfo>(std::move(c));
}

absl::StatusOr<ModelInfo> DeepseekV4Info(std::string_view config_json) {
  ASSIGN_OR_RETURN(const v4::DeepseekV4Config c, v4::ParseDeepseekV4Config(config_json));
  return v4::V4ModelInfo(c);
}

absl::StatusOr<const Architecture*> FindArchitecture(const std::string& model_type) {
  std::vector<std::string> known;
  for (const Architecture& a : Architectures()) {
    if (a.model_type == model_type) return &a;
    known.push_back(a.model_type);
  }
  return absl::InvalidArgumentError(absl::StrCat("config.json: field 'model_type' is '", model_type,
                                                 "'; supported: ", absl::StrJoin(known, ", ")));
}

}  // namespace

absl::StatusOr<std::string> ModelTypeOfConfig(std::string_view text) {
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  auto it = config.find("model_type");
  if (it == config.end()) return absl::InvalidArgumentError("config.json: field 'model_type' is required");
  if (!it->is_string()) return absl::InvalidArgumentError("config.json: field 'model_type' must be a string");
  return it->get<std::string>();
}

const std::vector<Architecture>& Architectures() {
  static const std::vector<Architecture>* all = new std::vector<Architecture>{
      {.model_type = "deepseek_v2", .load = LoadDeepseekBackend, .kv_streams = DeepseekLatentStreams,
       .info = DeepseekInfo},
      {.model_type = "deepseek_v3", .load = LoadDeepseekBackend, .kv_streams = DeepseekLatentStreams,
       .info = DeepseekInfo},
      // On the CPU over the engine's paged pool (engine/model/deepseek_v4/v4_backend.h).
      {.model_type = "deepseek_v4",
       .load = v4::LoadV4Backend,
       .kv_streams = DeepseekV4Streams,
       .info = DeepseekV4Info},
  };
  return *all;
}

absl::StatusOr<std::string> ReadModelType(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
  return ModelTypeOfConfig(text);
}

absl::StatusOr<ModelKvStreams> KvStreamsForConfig(std::string_view config_json, int32_t block_size,
                                                  const KvStreamOptions& options) {
  ASSIGN_OR_RETURN(const std::string model_type, ModelTypeOfConfig(config_json));
  ASSIGN_OR_RETURN(const Architecture* a, FindArchitecture(model_type));
  if (!a->kv_streams) return absl::UnimplementedError(absl::StrCat("model_type '", model_type, "' declares no KV"));
  ASSIGN_OR_RETURN(ModelKvStreams streams, a->kv_streams(config_json, options));
  RETURN_IF_ERROR(ValidateKvStreams(streams.streams, streams.num_layers, block_size));
  return streams;
}

absl::StatusOr<ModelInfo> LoadModelInfo(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/config.json"));
  ASSIGN_OR_RETURN(const std::string model_type, ModelTypeOfConfig(text));
  ASSIGN_OR_RETURN(const Architecture* a, FindArchitecture(model_type));
  if (!a->info) return absl::UnimplementedError(absl::StrCat("model_type '", model_type, "' describes no ModelInfo"));
  return a->info(text);
}

absl::StatusOr<std::unique_ptr<ModelBackend>> LoadModelBackend(const std::string& dir, const BackendOptions& options) {
  ASSIGN_OR_RETURN(const std::string model_type, ReadModelType(dir));
  ASSIGN_OR_RETURN(const Architecture* a, FindArchitecture(model_type));
  return a->load(dir, options);
}

}  // namespace tandem
