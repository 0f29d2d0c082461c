#include "engine/model/deepseek_v4/v4_generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/checkpoint.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_tensor_names.h"
#include "engine/model/safetensors.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace tandem::v4 {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const std::map<std::string, std::string>& Presets() {
  static const auto* presets = new std::map<std::string, std::string>{
      {"tiny-v4", R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "hidden_size": 64,
  "moe_intermediate_size": 32,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 1,
  "head_dim": 64,
  "partial_rotary_factor": 0.25,
  "q_lora_rank": 32,
  "o_groups": 2,
  "o_lora_rank": 16,
  "n_routed_experts": 8,
  "num_experts_per_tok": 2,
  "n_shared_experts": 1,
  "scoring_func": "sqrtsoftplus",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                  "compressed_sparse_attention"],
  "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
  "sliding_window": 16,
  "index_n_heads": 8,
  "index_head_dim": 32,
  "index_topk": 8,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06,
  "swiglu_limit": 1.5,
  "max_position_embeddings": 4096,
  "rope_theta": 10000.0,
  "compress_rope_theta": 160000.0,
  "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                      "beta_fast": 32, "beta_slow": 1},
  "num_nextn_predict_layers": 1,
  "rms_norm_eps": 1e-06,
  "hidden_act": "silu",
  "tie_word_embeddings": false,
  "bos_token_id": 0,
  "eos_token_id": 1
})"},
  };
  return *presets;
}

// How a tensor's values are drawn.
enum class Init {
  kLinear,     // N(0, 1 / fan_in)
  kEmbedding,  // N(0, 1)
  kNorm,       // 1 + N(0, 0.25^2)
  kScale,      // mHC scales: 1 + N(0, 0.25^2)
  kWide,       // sinks: N(0, 1)
  kHalf,       // position biases, mHC base: N(0, 0.5^2)
  kBias,       // the routing correction bias: N(0, 0.1^2)
  kExpertId,   // tid2eid: uniform over the experts
};

// What a tensor is, which decides its stored format per --dtype.
enum class Role {
  kEmbedding,     // embed, head
  kNorm,          // RMSNorm weights
  kFp32Param,     // mHC, sinks, position biases, correction bias
  kLinear,        // attention projections, indexer q, shared experts, MTP projections
  kBf16Linear,    // compressors, indexer weights_proj, router: never FP8 (as DeepSeek ships them)
  kRoutedExpert,  // FP4 in fp8 checkpoints
  kIndex,         // tid2eid
};

enum class Format { kF32, kBF16, kFp8, kFp4, kI64 };

struct Planned {
  std::string official;  // keys the random values, whatever the stored name
  std::string name;      // as stored
  std::vector<int64_t> shape;
  Init init;
  Format format;
};

// Counter-based random numbers: value i of a tensor depends only on (seed, its official
// name, i), computed with integer arithmetic and exact float operations.
uint64_t Bits(uint64_t key, uint64_t i) {
  unsigned char bytes[8];
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<unsigned char>(i >> (8 * b));
  return XXH3_64bits_withSeed(bytes, sizeof bytes, key);
}
float Normal(uint64_t key, uint64_t i) {  // Irwin-Hall of four 16-bit uniforms, unit variance
  const uint64_t r = Bits(key, i);
  float sum = 0.0f;
  for (int j = 0; j < 4; ++j) sum += static_cast<float>((r >> (16 * j)) & 0xffff) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;
}

// The smallest e with limit * 2^e >= amax (a power-of-two scale that fits the block).
int ScaleExponent(float amax, float limit) {
  if (amax == 0.0f) return 0;
  int e = static_cast<int>(std::ceil(std::log2(amax / limit)));
  while (std::ldexp(limit, e) < amax) ++e;
  while (std::ldexp(limit, e - 1) >= amax) --e;
  return std::clamp(e, -127, 127);
}

uint8_t E8m0Byte(int e) { return static_cast<uint8_t>(e + 127); }

// Nearest e2m1 code of v (|v| <= 6); a tie goes to the even code.
uint8_t ToFp4(float v) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(v);
  int best = 0;
  for (int k = 1; k < 8; ++k) {
    const float dk = std::fabs(a - kMag[k]), db = std::fabs(a - kMag[best]);
    if (dk < db || (dk == db && k % 2 == 0)) best = k;
  }
  return static_cast<uint8_t>(best | (v < 0.0f && best != 0 ? 8 : 0));
}

class V4CheckpointBuilder {
 public:
  V4CheckpointBuilder(const DeepseekV4Config& c, uint64_t seed, DType dtype)
      : c_(c), seed_(seed), dtype_(dtype),
        naming_(dtype == DType::kF8E4M3 ? TensorNaming::kOfficial : TensorNaming::kTransformersSaved) {}

  void Plan() {
    const int64_t dm = c_.hidden_size;
    Add("embed.weight", {c_.vocab_size, dm}, Init::kEmbedding, Role::kEmbedding);
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      AddLayer(absl::StrCat("layers.", i, "."), c_.layer_types[i], c_.mlp_layer_types[i]);
    }
    if (naming_ == TensorNaming::kOfficial) {  // transformers drops MTP layers: they exist only in official files
      for (int64_t j = 0; j < c_.num_nextn_predict_layers; ++j) {
        const std::string p = absl::StrCat("mtp.", j, ".");
        Add(p + "e_proj.weight", {dm, dm}, Init::kLinear, Role::kLinear);
        Add(p + "h_proj.weight", {dm, dm}, Init::kLinear, Role::kLinear);
        for (const char* n : {"enorm.weight", "hnorm.weight", "norm.weight"}) Add(p + n, {dm}, Init::kNorm, Role::kNorm);
        AddHyperHead(p);
        AddLayer(p, c_.mtp_attention_type, MlpType::kMoe);
      }
    }
    Add("norm.weight", {dm}, Init::kNorm, Role::kNorm);
    AddHyperHead("");
    if (!c_.tie_word_embeddings) Add("head.weight", {c_.vocab_size, dm}, Init::kLinear, Role::kEmbedding);
  }

  int64_t num_parameters() const { return num_parameters_; }
  uint64_t total_bytes() const {
    uint64_t n = 0;
    for (const Planned& p : planned_) {
      for (const auto& spec : Specs(p)) n += spec.num_bytes();
    }
    return n;
  }

  absl::Status Write(const fs::path& dir, int num_shards, const std::function<void(uint64_t, uint64_t)>& progress) {
    const uint64_t total = total_bytes();
    // Shards of roughly equal size; a quantized weight and its scales stay together.
    std::vector<size_t> starts = {0};
    const uint64_t per_shard = (total + num_shards - 1) / std::max(num_shards, 1);
    uint64_t bytes = 0;
    for (size_t i = 0; i < planned_.size(); ++i) {
      if (bytes >= per_shard && static_cast<int>(starts.size()) < num_shards) {
        starts.push_back(i);
        bytes = 0;
      }
      for (const auto& spec : Specs(planned_[i])) bytes += spec.num_bytes();
    }
    starts.push_back(planned_.size());
    const int files = static_cast<int>(starts.size()) - 1;
    Json weight_map = Json::object();
    uint64_t written = 0;
    for (int s = 0; s < files; ++s) {
      const std::string file =
          num_shards <= 1 ? "model.safetensors" : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, files);
      std::vector<SafetensorsStreamWriter::TensorSpec> specs;
      for (size_t i = starts[s]; i < starts[s + 1]; ++i) {
        for (auto& spec : Specs(planned_[i])) {
          weight_map[spec.name] = file;
          specs.push_back(std::move(spec));
        }
      }
      ASSIGN_OR_RETURN(auto writer,
                       SafetensorsStreamWriter::Create((dir / file).string(), std::move(specs), {{"format", "pt"}}));
      for (size_t i = starts[s]; i < starts[s + 1]; ++i) {
        for (const std::vector<std::byte>& part : Generate(planned_[i])) {
          RETURN_IF_ERROR(writer->Append(part));
          written += part.size();
        }
        if (progress) progress(written, total);
      }
      RETURN_IF_ERROR(writer->Finish());
    }
    if (num_shards <= 1) return absl::OkStatus();
    Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    return WriteStringToFile((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }

 private:
  Format FormatOf(Role role) const {
    if (role == Role::kIndex) return Format::kI64;
    if (dtype_ == DType::kF32) return Format::kF32;
    if (dtype_ == DType::kBF16) {
      // save_pretrained keeps transformers' _keep_in_fp32_modules_strict in float32.
      return role == Role::kFp32Param || role == Role::kNorm ? Format::kF32 : Format::kBF16;
    }
    switch (role) {  // the official checkpoints' formats (shared/models/deepseek-v4.md §4.1)
      case Role::kFp32Param: return Format::kF32;
      case Role::kLinear: return Format::kFp8;
      case Role::kRoutedExpert: return Format::kFp4;
      default: return Format::kBF16;
    }
  }

  void Add(const std::string& official, std::vector<int64_t> shape, Init init, Role role) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    num_parameters_ += n;
    Format format = FormatOf(role);
    // FP4 packs pairs along the input; an odd width falls back to FP8.
    if (format == Format::kFp4 && shape[1] % 2 != 0) format = Format::kFp8;
    planned_.push_back({official, CandidateNames(naming_, official).front(), std::move(shape), init, format});
  }

  void AddLinear(const std::string& official, int64_t rows, int64_t cols, Role role = Role::kLinear) {
    Add(official, {rows, cols}, Init::kLinear, role);
  }

  void AddHyperHead(const std::string& p) {
    const int64_t n = c_.hc_mult;
    Add(p + "hc_head_fn", {n, n * c_.hidden_size}, Init::kLinear, Role::kFp32Param);
    Add(p + "hc_head_base", {n}, Init::kHalf, Role::kFp32Param);
    Add(p + "hc_head_scale", {1}, Init::kScale, Role::kFp32Param);
  }

  void AddCompressor(const std::string& p, int64_t width, int64_t proj, int64_t rate) {
    AddLinear(p + "wkv.weight", proj, c_.hidden_size, Role::kBf16Linear);
    AddLinear(p + "wgate.weight", proj, c_.hidden_size, Role::kBf16Linear);
    Add(p + "ape", {rate, proj}, Init::kHalf, Role::kFp32Param);
    Add(p + "norm.weight", {width}, Init::kNorm, Role::kNorm);
  }

  void AddExpert(const std::string& p, Role role) {
    AddLinear(p + "w1.weight", c_.moe_intermediate_size, c_.hidden_size, role);
    AddLinear(p + "w2.weight", c_.hidden_size, c_.moe_intermediate_size, role);
    AddLinear(p + "w3.weight", c_.moe_intermediate_size, c_.hidden_size, role);
  }

  void AddLayer(const std::string& p, AttentionType attention, MlpType mlp) {
    const int64_t dm = c_.hidden_size, d = c_.head_dim, n = c_.hc_mult, mix = (2 + n) * n;
    Add(p + "attn_norm.weight", {dm}, Init::kNorm, Role::kNorm);
    Add(p + "ffn_norm.weight", {dm}, Init::kNorm, Role::kNorm);
    for (const char* site : {"attn", "ffn"}) {
      Add(absl::StrCat(p, "hc_", site, "_fn"), {mix, n * dm}, Init::kLinear, Role::kFp32Param);
      Add(absl::StrCat(p, "hc_", site, "_base"), {mix}, Init::kHalf, Role::kFp32Param);
      Add(absl::StrCat(p, "hc_", site, "_scale"), {3}, Init::kScale, Role::kFp32Param);
    }
    const std::string s = p + "attn.";
    AddLinear(s + "wq_a.weight", c_.q_lora_rank, dm);
    Add(s + "q_norm.weight", {c_.q_lora_rank}, Init::kNorm, Role::kNorm);
    AddLinear(s + "wq_b.weight", c_.num_attention_heads * d, c_.q_lora_rank);
    AddLinear(s + "wkv.weight", d, dm);
    Add(s + "kv_norm.weight", {d}, Init::kNorm, Role::kNorm);
    AddLinear(s + "wo_a.weight", c_.o_groups * c_.o_lora_rank, c_.o_group_in());
    AddLinear(s + "wo_b.weight", dm, c_.o_groups * c_.o_lora_rank);
    Add(s + "attn_sink", {c_.num_attention_heads}, Init::kWide, Role::kFp32Param);
    if (attention == AttentionType::kCompressedSparse) {
      const int64_t ci = c_.index_head_dim, m = c_.compress_rate_csa;
      AddCompressor(s + "compressor.", d, 2 * d, m);
      AddLinear(s + "indexer.wq_b.weight", c_.index_n_heads * ci, c_.q_lora_rank);
      AddLinear(s + "indexer.weights_proj.weight", c_.index_n_heads, dm, Role::kBf16Linear);
      AddCompressor(s + "indexer.compressor.", ci, 2 * ci, m);
    } else if (attention == AttentionType::kHeavilyCompressed) {
      AddCompressor(s + "compressor.", d, d, c_.compress_rate_hca);
    }
    const std::string f = p + "ffn.";
    AddLinear(f + "gate.weight", c_.n_routed_experts, dm, Role::kBf16Linear);
    if (mlp == MlpType::kHashMoe) {
      Add(f + "gate.tid2eid", {c_.vocab_size, c_.num_experts_per_tok}, Init::kExpertId, Role::kIndex);
    } else {
      Add(f + "gate.bias", {c_.n_routed_experts}, Init::kBias, Role::kFp32Param);
    }
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) AddExpert(absl::StrCat(f, "experts.", e, "."), Role::kRoutedExpert);
    AddExpert(f + "shared_experts.", Role::kLinear);
  }

  static int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

  // The stored tensors of one planned tensor: itself, then its scales if quantized.
  std::vector<SafetensorsStreamWriter::TensorSpec> Specs(const Planned& p) const {
    switch (p.format) {
      case Format::kF32: return {{p.name, DType::kF32, p.shape}};
      case Format::kBF16: return {{p.name, DType::kBF16, p.shape}};
      case Format::kI64: return {{p.name, DType::kI64, p.shape}};
      case Format::kFp8:
        return {{p.name, DType::kF8E4M3, p.shape},
                {ScaleNames(p.name).front(), DType::kF8E8M0, {CeilDiv(p.shape[0], 128), CeilDiv(p.shape[1], 128)}}};
      case Format::kFp4:
        return {{p.name, DType::kI8, {p.shape[0], p.shape[1] / 2}},
                {ScaleNames(p.name).front(), DType::kF8E8M0, {p.shape[0], CeilDiv(p.shape[1], 32)}}};
    }
    return {};
  }

  std::vector<std::vector<std::byte>> Generate(const Planned& p) const {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    const uint64_t key = XXH64(p.official.data(), p.official.size(), seed_);
    std::vector<std::byte> out;
    if (p.init == Init::kExpertId) {
      out.resize(static_cast<size_t>(n) * 8);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t e = static_cast<int64_t>(Bits(key, i) % static_cast<uint64_t>(c_.n_routed_experts));
        for (int b = 0; b < 8; ++b) out[8 * i + b] = static_cast<std::byte>((static_cast<uint64_t>(e) >> (8 * b)) & 0xff);
      }
      return {std::move(out)};
    }
    std::vector<float> v(static_cast<size_t>(n));
    const float fan_in = p.shape.size() == 2 ? static_cast<float>(p.shape[1]) : 1.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float z = Normal(key, i);
      switch (p.init) {
        case Init::kLinear: v[i] = z / std::sqrt(fan_in); break;
        case Init::kEmbedding:
        case Init::kWide: v[i] = z; break;
        case Init::kNorm:
        case Init::kScale: v[i] = 1.0f + 0.25f * z; break;
        case Init::kHalf: v[i] = 0.5f * z; break;
        case Init::kBias: v[i] = 0.1f * z; break;
        case Init::kExpertId: break;
      }
    }
    switch (p.format) {
      case Format::kF32:
        out.resize(static_cast<size_t>(n) * 4);
        std::memcpy(out.data(), v.data(), out.size());
        return {std::move(out)};
      case Format::kBF16:
        out.resize(static_cast<size_t>(n) * 2);
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t b = F32ToBf16(v[i]);
          std::memcpy(out.data() + 2 * i, &b, 2);
        }
        return {std::move(out)};
      case Format::kFp8: return QuantizeFp8(p.shape[0], p.shape[1], v);
      case Format::kFp4: return QuantizeFp4(p.shape[0], p.shape[1], v);
      case Format::kI64: break;
    }
    TANDEM_CHECK(false) << "unplanned format for " << p.name;
    return {};
  }

  // e4m3 values with one power-of-two (ue8m0) scale per 128x128 block.
  static std::vector<std::vector<std::byte>> QuantizeFp8(int64_t rows, int64_t cols, const std::vector<float>& v) {
    const int64_t b = 128, sr = CeilDiv(rows, b), sc = CeilDiv(cols, b);
    std::vector<std::byte> q(static_cast<size_t>(rows * cols)), s(static_cast<size_t>(sr * sc));
    for (int64_t br = 0; br < sr; ++br) {
      for (int64_t bc = 0; bc < sc; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
        const int e = ScaleExponent(amax, 448.0f);
        s[br * sc + bc] = static_cast<std::byte>(E8m0Byte(e));
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c)
            q[r * cols + c] = static_cast<std::byte>(F32ToF8E4M3(std::ldexp(v[r * cols + c], -e)));
      }
    }
    return {std::move(q), std::move(s)};
  }

  // e2m1 pairs (low nibble first) with one ue8m0 scale per 32 values of a row.
  static std::vector<std::vector<std::byte>> QuantizeFp4(int64_t rows, int64_t cols, const std::vector<float>& v) {
    const int64_t g = 32, groups = CeilDiv(cols, g);
    std::vector<std::byte> q(static_cast<size_t>(rows * cols / 2)), s(static_cast<size_t>(rows * groups));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < groups; ++k) {
        const int64_t c0 = k * g, c1 = std::min(cols, c0 + g);
        float amax = 0.0f;
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
        const int e = ScaleExponent(amax, 6.0f);
        s[r * groups + k] = static_cast<std::byte>(E8m0Byte(e));
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t code = ToFp4(std::ldexp(v[r * cols + c], -e));
          auto& byte = q[(r * cols + c) / 2];
          byte = static_cast<std::byte>(c % 2 == 0 ? (static_cast<uint8_t>(byte) & 0xf0) | code
                                                   : (static_cast<uint8_t>(byte) & 0x0f) | (code << 4));
        }
      }
    }
    return {std::move(q), std::move(s)};
  }

  const DeepseekV4Config& c_;
  uint64_t seed_;
  DType dtype_;
  TensorNaming naming_;
  std::vector<Planned> planned_;
  int64_t num_parameters_ = 0;
};

}  // namespace

absl::StatusOr<std::string> V4PresetConfig(const std::string& preset) {
  auto it = Presets().find(preset);
  if (it == Presets().end()) return absl::NotFoundError(absl::StrCat("unknown DeepSeek-V4 preset '", preset, "'"));
  return it->second;
}

std::vector<std::string> V4PresetNames() {
  std::vector<std::string> names;
  for (const auto& [k, v] : Presets()) names.push_back(k);
  return names;
}

bool IsDeepseekV4Config(std::string_view config_json) {
  const Json j = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("model_type") && j["model_type"] == "deepseek_v4";
}

absl::StatusOr<GeneratedModel> GenerateDeepseekV4Model(const ModelGeneratorOptions& options, const std::string& dir_str) {
  if (options.weight_dtype != DType::kF32 && options.weight_dtype != DType::kBF16 &&
      options.weight_dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError("make-model writes DeepSeek-V4 weights as f32, bf16 or fp8 (with FP4 experts)");
  }
  if (!options.write_weights) {
    return absl::InvalidArgumentError("weights generated on the GPU are not available for DeepSeek-V4");
  }
  if (options.mtp_acceptance) {
    return absl::InvalidArgumentError("--mtp-acceptance: needs a deepseek_v3 config, not model_type deepseek_v4");
  }
  ASSIGN_OR_RETURN(GeneratorStart start, StartGeneratedModel(options, dir_str));
  Json& config = start.config;
  const GeneratorTokenizerPlan& tokenizer = start.tokenizer;
  GeneratedModel result;
  result.dir = dir_str;
  const fs::path dir(dir_str);
  if (options.weight_dtype == DType::kF8E4M3) {
    config["expert_dtype"] = "fp4";
    config["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                     {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}};
  }
  config["torch_dtype"] = options.weight_dtype == DType::kF32 ? "float32" : "bfloat16";
  const std::string config_text = config.dump(2) + "\n";
  ASSIGN_OR_RETURN(DeepseekV4Config c, ParseDeepseekV4Config(config_text));
  ASSIGN_OR_RETURN(result.tokenizer, WriteGeneratorTokenizer(options, tokenizer, c.vocab_size, dir_str));

  V4CheckpointBuilder builder(c, options.seed, options.weight_dtype);
  builder.Plan();
  result.num_parameters = builder.num_parameters();
  result.weight_bytes = builder.total_bytes();
  RemoveGeneratedModelFiles(dir_str);
  RETURN_IF_ERROR(builder.Write(dir, options.num_shards, options.progress));
  RETURN_IF_ERROR(WriteStringToFile((dir / "config.json").string(), config_text));
  return result;
}

}  // namespace tandem::v4
