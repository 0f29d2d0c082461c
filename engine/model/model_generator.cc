#include "engine/model/model_generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/chat_template/builtin_templates.h"
#include "engine/model/checkpoint.h"
#include "engine/model/generator_random.h"
#include "engine/model/model_config.h"
#include "engine/model/mtp_test_model.h"
#include "engine/model/safetensors.h"
#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr int64_t kDeepseekV3VocabSize = 129280;  // DeepSeek-V3's embedding rows

const std::map<std::string, std::string>& Presets() {
  static const auto* presets = new std::map<std::string, std::string>{
      {"tiny", R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "model_type": "deepseek_v3",
  "hidden_size": 128,
  "intermediate_size": 256,
  "moe_intermediate_size": 64,
  "num_hidden_layers": 3,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "q_lora_rank": 64,
  "kv_lora_rank": 64,
  "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16,
  "v_head_dim": 32,
  "n_routed_experts": 8,
  "n_shared_experts": 1,
  "num_experts_per_tok": 2,
  "n_group": 2,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "scoring_func": "sigmoid",
  "norm_topk_prob": true,
  "routed_scaling_factor": 2.5,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "num_nextn_predict_layers": 1,
  "hidden_act": "silu",
  "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "rope_interleave": true,
  "tie_word_embeddings": false,
  "attention_bias": false,
  "bos_token_id": 0,
  "eos_token_id": 1
})"},
      {"tiny-v2", R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "model_type": "deepseek_v2",
  "hidden_size": 128,
  "intermediate_size": 256,
  "moe_intermediate_size": 64,
  "num_hidden_layers": 3,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "q_lora_rank": null,
  "kv_lora_rank": 64,
  "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16,
  "v_head_dim": 32,
  "n_routed_experts": 8,
  "n_shared_experts": 2,
  "num_experts_per_tok": 2,
  "n_group": 2,
  "topk_group": 1,
  "topk_method": "group_limited_greedy",
  "scoring_func": "softmax",
  "norm_topk_prob": false,
  "routed_scaling_factor": 1.0,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "hidden_act": "silu",
  "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "tie_word_embeddings": false,
  "attention_bias": false,
  "bos_token_id": 0,
  "eos_token_id": 1
})"},
  };
  return *presets;
}

using generator::NormalSample;
using generator::UniformSample;

enum class Init { kLinear, kEmbedding, kNorm, kBias };

// Plans the checkpoint's tensors (names, shapes, stored types), then generates and writes
// them one at a time, so memory stays at one tensor whatever the model's size.
class CheckpointBuilder {
 public:
  CheckpointBuilder(uint64_t seed, DType dtype) : seed_(seed), dtype_(dtype) {}

  void Add(const std::string& name, std::vector<int64_t> shape, Init init, bool quantizable = true) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    num_parameters_ += n;
    // Norms and biases stay in bf16 (as real checkpoints keep them); FP8 applies to the
    // linear layers DeepSeek quantizes (not embeddings, the LM head or the router).
    DType dtype = dtype_;
    if (shape.size() != 2 || (dtype == DType::kF8E4M3 && !quantizable)) {
      dtype = dtype_ == DType::kF32 ? DType::kF32 : DType::kBF16;
    }
    if (init == Init::kBias) dtype = DType::kF32;  // e_score_correction_bias is fp32 in DeepSeek-V3
    planned_.push_back({{name, dtype, shape}, init});
    if (dtype == DType::kF8E4M3) {
      // The block scales follow their weight immediately (written together).
      planned_.push_back({{name + "_scale_inv", DType::kF32, {(shape[0] + 127) / 128, (shape[1] + 127) / 128}},
                          init, /*is_scale=*/true});
    }
  }

  // Rewrites each tensor's drawn values before they are stored (a test construction's).
  using ValueAdjuster =
      std::function<void(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& values)>;
  void set_value_adjuster(ValueAdjuster adjust) { adjust_ = std::move(adjust); }

  int64_t num_parameters() const { return num_parameters_; }
  uint64_t total_bytes() const {
    uint64_t total = 0;
    for (const Planned& p : planned_) total += p.spec.num_bytes();
    return total;
  }

  // Writes planned tensors [begin, end) into one safetensors file.
  absl::Status WriteFile(const std::string& path, size_t begin, size_t end,
                         const std::function<void(uint64_t, uint64_t)>& progress, uint64_t* written) const {
    std::vector<SafetensorsStreamWriter::TensorSpec> specs;
    for (size_t i = begin; i < end; ++i) specs.push_back(planned_[i].spec);
    ASSIGN_OR_RETURN(auto writer, SafetensorsStreamWriter::Create(path, std::move(specs), {{"format", "pt"}}));
    std::vector<std::byte> bytes, scale_bytes;
    for (size_t i = begin; i < end; ++i) {
      const Planned& p = planned_[i];
      if (p.is_scale) continue;  // written with its weight
      Generate(p, &bytes, &scale_bytes);
      RETURN_IF_ERROR(writer->Append(bytes));
      *written += bytes.size();
      if (p.spec.dtype == DType::kF8E4M3) {
        RETURN_IF_ERROR(writer->Append(scale_bytes));
        *written += scale_bytes.size();
      }
      if (progress) progress(*written, total_bytes());
    }
    return writer->Finish();
  }

  // Shard boundaries: consecutive tensors of roughly equal total size, never splitting
  // an FP8 weight from its scales.
  std::vector<size_t> ShardStarts(int num_shards) const {
    std::vector<size_t> starts = {0};
    const uint64_t per_shard = (total_bytes() + num_shards - 1) / num_shards;
    uint64_t bytes = 0;
    for (size_t i = 0; i < planned_.size(); ++i) {
      if (bytes >= per_shard && static_cast<int>(starts.size()) < num_shards && !planned_[i].is_scale) {
        starts.push_back(i);
        bytes = 0;
      }
      bytes += planned_[i].spec.num_bytes();
    }
    starts.push_back(planned_.size());
    return starts;
  }
  const std::string& name(size_t i) const { return planned_[i].spec.name; }

 private:
  struct Planned {
    SafetensorsStreamWriter::TensorSpec spec;
    Init init;
    bool is_scale = false;
  };

  void Generate(const Planned& p, std::vector<std::byte>* out, std::vector<std::byte>* scales_out) const {
    const std::string& name = p.spec.name;
    const std::vector<int64_t>& shape = p.spec.shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const uint64_t key = XXH64(name.data(), name.size(), seed_);
    std::vector<float> values(static_cast<size_t>(n));
    const float fan_in = shape.size() == 2 ? static_cast<float>(shape[1]) : 1.0f;
    for (int64_t i = 0; i < n; ++i) {
      switch (p.init) {
        case Init::kLinear: values[i] = NormalSample(key, i) / std::sqrt(fan_in); break;
        case Init::kEmbedding: values[i] = NormalSample(key, i); break;
        case Init::kNorm: values[i] = 1.0f + 0.25f * UniformSample(key, i); break;
        case Init::kBias: values[i] = 0.1f * UniformSample(key, i); break;
      }
    }
    if (adjust_) adjust_(name, shape, values);
    const DType dtype = p.spec.dtype;
    if (dtype == DType::kF8E4M3) {
      QuantizeFp8(shape, values, out, scales_out);
      return;
    }
    out->resize(static_cast<size_t>(n) * DTypeSize(dtype));
    for (int64_t i = 0; i < n; ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(out->data() + 4 * i, &values[i], 4);
      } else {
        const uint16_t v = F32ToBf16(values[i]);
        std::memcpy(out->data() + 2 * i, &v, 2);
      }
    }
  }

  static void QuantizeFp8(const std::vector<int64_t>& shape, const std::vector<float>& values,
                          std::vector<std::byte>* q, std::vector<std::byte>* scale_bytes) {
    const int64_t rows = shape[0], cols = shape[1], b = 128;
    const int64_t sr = (rows + b - 1) / b, sc = (cols + b - 1) / b;
    std::vector<float> scales(static_cast<size_t>(sr * sc));
    q->resize(static_cast<size_t>(rows * cols));
    for (int64_t br = 0; br < sr; ++br) {
      for (int64_t bc = 0; bc < sc; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c)
            amax = std::max(amax, std::fabs(values[r * cols + c]));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        scales[br * sc + bc] = scale;
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c)
            (*q)[r * cols + c] = static_cast<std::byte>(F32ToF8E4M3(values[r * cols + c] / scale));
      }
    }
    scale_bytes->resize(scales.size() * 4);
    std::memcpy(scale_bytes->data(), scales.data(), scale_bytes->size());
  }

  uint64_t seed_;
  DType dtype_;
  ValueAdjuster adjust_;
  std::vector<Planned> planned_;
  int64_t num_parameters_ = 0;
};

void AddMlp(CheckpointBuilder& b, const std::string& p, int64_t hidden, int64_t inter) {
  b.Add(p + "gate_proj.weight", {inter, hidden}, Init::kLinear);
  b.Add(p + "up_proj.weight", {inter, hidden}, Init::kLinear);
  b.Add(p + "down_proj.weight", {hidden, inter}, Init::kLinear);
}

void AddDecoderLayer(CheckpointBuilder& b, const ModelConfig& c, int64_t i) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads;
  b.Add(p + "input_layernorm.weight", {hidden}, Init::kNorm);
  b.Add(p + "post_attention_layernorm.weight", {hidden}, Init::kNorm);
  const std::string s = p + "self_attn.";
  if (c.q_lora_rank) {
    b.Add(s + "q_a_proj.weight", {*c.q_lora_rank, hidden}, Init::kLinear);
    b.Add(s + "q_a_layernorm.weight", {*c.q_lora_rank}, Init::kNorm);
    b.Add(s + "q_b_proj.weight", {heads * c.qk_head_dim(), *c.q_lora_rank}, Init::kLinear);
  } else {
    b.Add(s + "q_proj.weight", {heads * c.qk_head_dim(), hidden}, Init::kLinear);
  }
  b.Add(s + "kv_a_proj_with_mqa.weight", {c.kv_entry_dim(), hidden}, Init::kLinear);
  b.Add(s + "kv_a_layernorm.weight", {c.kv_lora_rank}, Init::kNorm);
  b.Add(s + "kv_b_proj.weight", {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, Init::kLinear);
  b.Add(s + "o_proj.weight", {hidden, heads * c.v_head_dim}, Init::kLinear);
  const std::string m = p + "mlp.";
  if (c.IsMoeLayer(i)) {
    b.Add(m + "gate.weight", {c.n_routed_experts, hidden}, Init::kLinear, /*quantizable=*/false);
    if (c.topk_method == TopkMethod::kNoauxTc) {
      b.Add(m + "gate.e_score_correction_bias", {c.n_routed_experts}, Init::kBias);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      AddMlp(b, absl::StrCat(m, "experts.", e, "."), hidden, c.moe_intermediate_size);
    }
    if (c.n_shared_experts > 0) {
      AddMlp(b, m + "shared_experts.", hidden, c.moe_intermediate_size * c.n_shared_experts);
    }
  } else {
    AddMlp(b, m, hidden, c.intermediate_size);
  }
}

// own_embed_and_head: also the module's embed_tokens and shared_head.head, which
// DeepSeek-V3's checkpoint carries (the loader shares the main ones when they are absent).
void AddMtpLayer(CheckpointBuilder& b, const ModelConfig& c, int64_t i, bool own_embed_and_head) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const int64_t hidden = c.hidden_size;
  b.Add(p + "enorm.weight", {hidden}, Init::kNorm);
  b.Add(p + "hnorm.weight", {hidden}, Init::kNorm);
  b.Add(p + "eh_proj.weight", {hidden, 2 * hidden}, Init::kLinear);
  AddDecoderLayer(b, c, i);
  b.Add(p + "shared_head.norm.weight", {hidden}, Init::kNorm);
  if (own_embed_and_head) {
    b.Add(p + "embed_tokens.weight", {c.vocab_size, hidden}, Init::kEmbedding, /*quantizable=*/false);
    b.Add(p + "shared_head.head.weight", {c.vocab_size, hidden}, Init::kLinear, /*quantizable=*/false);
  }
}

absl::Status WriteShards(const CheckpointBuilder& b, int num_shards, const fs::path& dir,
                         const std::function<void(uint64_t, uint64_t)>& progress) {
  uint64_t written = 0;
  if (num_shards <= 1) {
    return b.WriteFile((dir / "model.safetensors").string(), 0, b.ShardStarts(1).back(), progress, &written);
  }
  const std::vector<size_t> starts = b.ShardStarts(num_shards);
  const int files = static_cast<int>(starts.size()) - 1;
  Json weight_map = Json::object();
  for (int s = 0; s < files; ++s) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, files);
    for (size_t i = starts[s]; i < starts[s + 1]; ++i) weight_map[b.name(i)] = file;
    RETURN_IF_ERROR(b.WriteFile((dir / file).string(), starts[s], starts[s + 1], progress, &written));
  }
  Json index = {{"metadata", {{"total_size", b.total_bytes()}}}, {"weight_map", weight_map}};
  return WriteStringToFile((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace

GeneratorTokenizerPlan PlanGeneratorTokenizer(const ModelGeneratorOptions& options,
                                              std::optional<int64_t> config_vocab_size) {
  // DeepSeek-V3's real tokenizer when it is available and fits the vocabulary.
  std::error_code ec;
  const fs::path real_dir(options.tokenizer_dir);
  const bool real_available = !options.tokenizer_dir.empty() && fs::exists(real_dir / "tokenizer.json", ec) &&
                              fs::exists(real_dir / "tokenizer_config.json", ec);
  GeneratorTokenizerPlan plan;
  plan.use_real = real_available && (!config_vocab_size || *config_vocab_size >= kDeepseekV3VocabSize);
  plan.vocab_size = config_vocab_size ? *config_vocab_size
                                      : (plan.use_real ? kDeepseekV3VocabSize : options.generated_vocab_size);
  return plan;
}

absl::StatusOr<GeneratorStart> StartGeneratedModel(const ModelGeneratorOptions& options, const std::string& dir) {
  GeneratorStart start;
  start.config = Json::parse(options.config_json, nullptr, /*allow_exceptions=*/false);
  Json& config = start.config;
  if (config.is_discarded() || !config.is_object()) return absl::InvalidArgumentError("model config is not a JSON object");
  if (options.num_shards < 1) return absl::InvalidArgumentError("number of shards must be at least 1");
  std::error_code ec;
  fs::create_directories(fs::path(dir), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", ec.message()));
  const bool has_vocab = config.contains("vocab_size") && !config["vocab_size"].is_null();
  if (has_vocab && !config["vocab_size"].is_number_integer()) {
    return absl::InvalidArgumentError("config.json: field 'vocab_size' must be an integer");
  }
  start.tokenizer = PlanGeneratorTokenizer(
      options, has_vocab ? std::optional<int64_t>(config["vocab_size"].get<int64_t>()) : std::nullopt);
  if (!has_vocab) config["vocab_size"] = start.tokenizer.vocab_size;
  return start;
}

void RemoveGeneratedModelFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(dir), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") || name == "model.safetensors.index.json") fs::remove(entry.path(), ec);
  }
  fs::remove(fs::path(dir) / kGeneratedWeightsFile, ec);
}

absl::StatusOr<std::string> WriteGeneratorTokenizer(const ModelGeneratorOptions& options,
                                                    const GeneratorTokenizerPlan& plan, int64_t vocab_size,
                                                    const std::string& dir_str) {
  std::error_code ec;
  const fs::path dir(dir_str);
  if (plan.use_real) {
    const fs::path real_dir(options.tokenizer_dir);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(real_dir / f, dir / f, fs::copy_options::overwrite_existing, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot copy tokenizer file ", f, ": ", ec.message()));
    }
    return std::string("deepseek-v3");
  }
  if (vocab_size < 300) {
    return absl::InvalidArgumentError("config.json: field 'vocab_size' must be at least 300 for a generated tokenizer");
  }
  GeneratedTokenizerFiles tok = BuildByteLevelTokenizer(static_cast<int>(vocab_size));
  // DeepSeek-V3's chat template, as the real tokenizer_config.json carries it: chat
  // requests to a generated model go through the same template rendering as a real
  // checkpoint's.
  Json tok_config = Json::parse(tok.tokenizer_config_json);
  tok_config["chat_template"] = std::string(DeepseekV3ChatTemplate());
  RETURN_IF_ERROR(WriteStringToFile((dir / "tokenizer.json").string(), tok.tokenizer_json));
  RETURN_IF_ERROR(WriteStringToFile((dir / "tokenizer_config.json").string(), tok_config.dump(2) + "\n"));
  return std::string("generated-byte-level");
}

absl::StatusOr<std::string> PresetConfig(const std::string& preset) {
  auto it = Presets().find(preset);
  if (it == Presets().end()) {
    std::string names;
    for (const auto& [k, v] : Presets()) absl::StrAppend(&names, names.empty() ? "" : ", ", k);
    return absl::NotFoundError(absl::StrCat("unknown preset '", preset, "' (presets: ", names, ")"));
  }
  return it->second;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& [k, v] : Presets()) names.push_back(k);
  return names;
}

absl::StatusOr<GeneratedModel> GenerateModel(const ModelGeneratorOptions& options, const std::string& dir_str) {
  if (options.weight_dtype == DType::kF16) {
    return absl::InvalidArgumentError("make-model writes bf16, f32 or fp8 weights, not f16");
  }
  ASSIGN_OR_RETURN(GeneratorStart start, StartGeneratedModel(options, dir_str));
  Json& config = start.config;
  const GeneratorTokenizerPlan& tokenizer = start.tokenizer;
  GeneratedModel result;
  result.dir = dir_str;
  const fs::path dir(dir_str);
  if (options.weight_dtype == DType::kF8E4M3) {
    config["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                                     {"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  }
  config["torch_dtype"] = options.weight_dtype == DType::kF32 ? "float32" : "bfloat16";
  std::string config_text = config.dump(2) + "\n";
  ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_text));
  if (options.mtp_acceptance) {
    RETURN_IF_ERROR(
        CheckMtpTestModelOptions(c, *options.mtp_acceptance, options.weight_dtype, options.write_weights));
  }

  ASSIGN_OR_RETURN(result.tokenizer, WriteGeneratorTokenizer(options, tokenizer, c.vocab_size, dir_str));

  CheckpointBuilder b(options.seed, options.weight_dtype);
  std::shared_ptr<const MtpTestWeights> mtp_test;
  if (options.mtp_acceptance) {
    // The construction's tables come from the tokenizer just written (which ids are
    // special); config.json records it so that a reader knows what the checkpoint is.
    ASSIGN_OR_RETURN(MtpTestModelSpec spec, PlanMtpTestModel(c, dir_str, *options.mtp_acceptance, options.seed));
    config[kMtpTestConfigKey] = MtpTestRecord(spec);
    config_text = config.dump(2) + "\n";
    mtp_test = std::make_shared<const MtpTestWeights>(spec, c);
    b.set_value_adjuster([mtp_test](const std::string& name, const std::vector<int64_t>& shape,
                                    std::vector<float>& values) { mtp_test->Adjust(name, shape, values); });
  }
  b.Add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, Init::kEmbedding, /*quantizable=*/false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) AddDecoderLayer(b, c, i);
  for (int64_t j = 0; j < c.num_nextn_predict_layers; ++j) {
    AddMtpLayer(b, c, c.num_hidden_layers + j, /*own_embed_and_head=*/mtp_test != nullptr);
  }
  b.Add("model.norm.weight", {c.hidden_size}, Init::kNorm);
  if (!c.tie_word_embeddings) {
    b.Add("lm_head.weight", {c.vocab_size, c.hidden_size}, Init::kLinear, /*quantizable=*/false);
  }
  result.num_parameters = b.num_parameters();

  RemoveGeneratedModelFiles(dir_str);
  result.weight_bytes = b.total_bytes();
  if (options.write_weights) {
    RETURN_IF_ERROR(WriteShards(b, options.num_shards, dir, options.progress));
  } else {
    if (options.weight_dtype != DType::kBF16) {
      return absl::InvalidArgumentError("weights generated on the GPU are bf16 only");
    }
    RETURN_IF_ERROR(WriteStringToFile((dir / kGeneratedWeightsFile).string(),
                                      absl::StrCat("{\"seed\": ", options.seed, "}\n")));
  }
  RETURN_IF_ERROR(WriteStringToFile((dir / "config.json").string(), config_text));
  return result;
}

}  // namespace tandem
