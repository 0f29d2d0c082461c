#include "engine/model/mtp_test_model.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/generator_random.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "xxhash.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;
using generator::NormalSample;
using generator::RandomBits;

// Streams of the construction's random choices, one per purpose, keyed by the seed.
uint64_t StreamKey(const std::string& purpose, uint64_t seed) {
  const std::string name = absl::StrCat("tandem_mtp_test.", purpose);
  return XXH64(name.data(), name.size(), seed);
}

absl::Status Refuse(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--mtp-acceptance: ", why));
}

// Whether token i of stream `key` is chosen with probability p, from integers only: the
// top 53 bits against p * 2^53 (exact for any double p in [0, 1]).
bool Bernoulli(uint64_t key, uint64_t i, double p) {
  return static_cast<double>(RandomBits(key, i) >> 11) < p * 9007199254740992.0;
}

}  // namespace

absl::Status CheckMtpTestModelOptions(const ModelConfig& config, double acceptance, DType dtype,
                                      bool write_weights) {
  if (!(acceptance >= 0.0 && acceptance <= 1.0)) {
    return Refuse(absl::StrCat("the acceptance rate must be in [0, 1], not ", acceptance));
  }
  if (config.model_type != "deepseek_v3") {
    return Refuse(absl::StrCat("needs a deepseek_v3 config, not model_type ", config.model_type));
  }
  if (config.num_nextn_predict_layers < 1) {
    return Refuse("needs an MTP layer (num_nextn_predict_layers >= 1)");
  }
  if (config.tie_word_embeddings) {
    return Refuse("needs tie_word_embeddings false (the embedding and the LM head differ in this construction)");
  }
  if (dtype != DType::kBF16 && dtype != DType::kF32) {
    return Refuse(absl::StrCat("writes bf16 or f32 weights, not ", std::string(DTypeName(dtype))));
  }
  // With --weights-on-gpu the CUDA backend builds the same construction at load from
  // config.json's record (engine/model/cuda/cuda_weights.cc), in bf16.
  if (!write_weights && dtype != DType::kBF16) return Refuse("with --weights-on-gpu writes bf16 weights only");
  return absl::OkStatus();
}

float MtpTestHeadScale(int64_t hidden_size, int64_t num_regular) {
  // ln n from n's bit width (an upper bound): integer arithmetic and sqrt, both exact on
  // every machine, where a libm log could differ in the last bit and change the bytes.
  const double ln_n = static_cast<double>(std::bit_width(static_cast<uint64_t>(num_regular))) * 0.6931471805599453;
  const double hidden = static_cast<double>(hidden_size);
  const double gap = hidden - std::sqrt(2.0 * hidden * ln_n);
  if (gap < 0.25 * hidden) return 0.0f;
  return static_cast<float>(kMtpTestTargetMargin / gap);
}

absl::StatusOr<MtpTestModelSpec> PlanMtpTestModel(const ModelConfig& config, const std::string& dir,
                                                  double acceptance, uint64_t seed) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromDir(dir));
  MtpTestModelSpec spec{.acceptance = acceptance, .seed = seed, .vocab_size = config.vocab_size,
                        .hidden_size = config.hidden_size};
  auto is_end = [&](int64_t id) {
    return std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) != config.eos_token_ids.end();
  };
  int64_t num_regular = 0;
  const int64_t known = std::min<int64_t>(config.vocab_size, tokenizer->vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    const bool regular = !tokenizer->IsAdded(id) && !tokenizer->IsSpecial(id) && !tokenizer->IdToToken(id).empty() &&
                         config.bos_token_id != id && !is_end(id);
    if (!regular) continue;
    ++num_regular;
    if (!spec.regular_token_ranges.empty() && spec.regular_token_ranges.back().second == id) {
      spec.regular_token_ranges.back().second = id + 1;
    } else {
      spec.regular_token_ranges.emplace_back(id, id + 1);
    }
  }
  if (num_regular < 3) {
    return Refuse(absl::StrCat("the vocabulary has ", num_regular, " regular tokens; the construction needs 3"));
  }
  if (MtpTestHeadScale(config.hidden_size, num_regular) == 0.0f) {
    return Refuse(absl::StrCat("hidden_size ", config.hidden_size, " is too small to tell ", num_regular,
                               " token vectors apart by a reliable margin"));
  }
  return spec;
}

Json MtpTestRecord(const MtpTestModelSpec& spec) {
  Json ranges = Json::array();
  for (const auto& [begin, end] : spec.regular_token_ranges) ranges.push_back({begin, end});
  return {{"note", "a test construction for measuring speculative decoding at a known acceptance rate, not a "
                   "language model (tandem make-model --mtp-acceptance; engine/model/mtp_test_model.h)"},
          {"acceptance", spec.acceptance},
          {"seed", spec.seed},
          {"regular_token_ranges", ranges}};
}

absl::StatusOr<MtpTestModelSpec> ReadMtpTestModelSpec(std::string_view config_json) {
  const Json root = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  if (!root.contains(kMtpTestConfigKey)) {
    return absl::NotFoundError(absl::StrCat("config.json has no '", kMtpTestConfigKey, "' record"));
  }
  const Json& r = root[kMtpTestConfigKey];
  const auto malformed = [](const std::string& field) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", kMtpTestConfigKey, "' lacks a valid '", field, "'"));
  };
  if (!r.is_object()) return malformed("record");
  if (!r.contains("acceptance") || !r["acceptance"].is_number()) return malformed("acceptance");
  if (!r.contains("seed") || !r["seed"].is_number_unsigned()) return malformed("seed");
  if (!r.contains("regular_token_ranges") || !r["regular_token_ranges"].is_array()) {
    return malformed("regular_token_ranges");
  }
  if (!root.contains("vocab_size") || !root["vocab_size"].is_number_integer()) return malformed("vocab_size");
  if (!root.contains("hidden_size") || !root["hidden_size"].is_number_integer()) return malformed("hidden_size");
  MtpTestModelSpec spec{.acceptance = r["acceptance"].get<double>(), .seed = r["seed"].get<uint64_t>(),
                        .vocab_size = root["vocab_size"].get<int64_t>(),
                        .hidden_size = root["hidden_size"].get<int64_t>()};
  int64_t previous_end = 0, num_regular = 0;
  for (const Json& range : r["regular_token_ranges"]) {
    if (!range.is_array() || range.size() != 2 || !range[0].is_number_integer() || !range[1].is_number_integer()) {
      return malformed("regular_token_ranges");
    }
    const int64_t begin = range[0].get<int64_t>(), end = range[1].get<int64_t>();
    if (begin < previous_end || end <= begin || end > spec.vocab_size) return malformed("regular_token_ranges");
    spec.regular_token_ranges.emplace_back(static_cast<int32_t>(begin), static_cast<int32_t>(end));
    previous_end = end;
    num_regular += end - begin;
  }
  if (num_regular < 3) return malformed("regular_token_ranges");
  return spec;
}

MtpTestTokens::MtpTestTokens(const MtpTestModelSpec& spec) {
  const int64_t vocab = spec.vocab_size;
  regular_index_.assign(static_cast<size_t>(vocab), -1);
  for (const auto& [begin, end] : spec.regular_token_ranges) {
    for (int32_t id = begin; id < end; ++id) {
      regular_index_[id] = static_cast<int32_t>(regular_.size());
      regular_.push_back(id);
    }
  }
  const int64_t n = num_regular();
  TANDEM_CHECK_GE(n, 3) << "the construction needs 3 regular tokens";

  // Sattolo's algorithm: a uniformly random permutation of the regular tokens' indices
  // that is one cycle (no fixed point, period n).
  std::vector<int32_t> next(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) next[i] = static_cast<int32_t>(i);
  const uint64_t cycle_key = StreamKey("successor", spec.seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(RandomBits(cycle_key, i) % static_cast<uint64_t>(i));
    std::swap(next[i], next[j]);
  }

  successor_.resize(static_cast<size_t>(vocab));
  vector_token_.resize(static_cast<size_t>(vocab));
  mtp_vector_token_.resize(static_cast<size_t>(vocab));
  head_vector_token_.assign(static_cast<size_t>(vocab), -1);
  const uint64_t alias_key = StreamKey("alias", spec.seed);
  const uint64_t good_key = StreamKey("good", spec.seed);
  const uint64_t decoy_key = StreamKey("decoy", spec.seed);
  for (int32_t t = 0; t < vocab; ++t) {
    const int64_t index = IsRegular(t) ? regular_index_[t]
                                       : static_cast<int64_t>(RandomBits(alias_key, t) % static_cast<uint64_t>(n));
    const int32_t successor = regular_[next[index]];
    vector_token_[t] = regular_[index];
    successor_[t] = successor;
    if (IsRegular(t)) head_vector_token_[successor] = t;
    if (Bernoulli(good_key, t, spec.acceptance)) {
      mtp_vector_token_[t] = regular_[index];
    } else {  // a decoy: any regular token but this one's vector, uniformly
      int64_t decoy = static_cast<int64_t>(RandomBits(decoy_key, t) % static_cast<uint64_t>(n - 1));
      if (decoy >= index) ++decoy;
      mtp_vector_token_[t] = regular_[decoy];
    }
  }
}

MtpTestWeights::MtpTestWeights(const MtpTestModelSpec& spec, const ModelConfig& config)
    : spec_(spec), tokens_(spec), num_hidden_layers_(config.num_hidden_layers),
      num_mtp_layers_(config.num_nextn_predict_layers),
      head_scale_(MtpTestHeadScale(config.hidden_size, tokens_.num_regular())),
      vector_key_(StreamKey("token_vectors", spec.seed)) {
  TANDEM_CHECK_EQ(spec.hidden_size, config.hidden_size);
}

void MtpTestWeights::TokenVector(int32_t token, float* out) const {
  // Scaled to RMS exactly 1: a random vector's squared norm varies by sqrt(2 / hidden),
  // and the tokens with the shortest vectors would otherwise have the least margin. The
  // squares of floats are exact in double (a fused multiply-add gives the same sum), and
  // sqrt is correctly rounded, so every machine still gets the same bits.
  const int64_t hidden = spec_.hidden_size;
  double sum_squares = 0.0;
  for (int64_t i = 0; i < hidden; ++i) {
    out[i] = NormalSample(vector_key_, static_cast<uint64_t>(token) * hidden + i);
    sum_squares += static_cast<double>(out[i]) * out[i];
  }
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(hidden) / sum_squares));
  for (int64_t i = 0; i < hidden; ++i) out[i] *= scale;
}

void MtpTestWeights::FillRows(std::vector<float>& values, float scale,
                              int32_t (MtpTestTokens::*row_token)(int32_t) const) const {
  const int64_t hidden = spec_.hidden_size;
  for (int32_t t = 0; t < spec_.vocab_size; ++t) {
    float* row = &values[static_cast<size_t>(t) * hidden];
    const int32_t source = (tokens_.*row_token)(t);
    if (source < 0) {
      std::fill(row, row + hidden, 0.0f);
      continue;
    }
    TokenVector(source, row);
    for (int64_t i = 0; i < hidden; ++i) row[i] *= scale;
  }
}

void MtpTestWeights::Adjust(const std::string& name, const std::vector<int64_t>& shape,
                            std::vector<float>& values) const {
  // Every RMSNorm weight (input, post-attention, q_a, kv_a, final, enorm, hnorm,
  // shared_head.norm): 1, so the vectors reach the heads as they are.
  if (name.ends_with("norm.weight")) {
    std::fill(values.begin(), values.end(), 1.0f);
    return;
  }
  // What each block adds to the residual stream, main and MTP alike.
  if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) {
    for (float& v : values) v *= kMtpTestLayerOutputScale;
    return;
  }
  if (name == "model.embed_tokens.weight") return FillRows(values, 1.0f, &MtpTestTokens::VectorToken);
  if (name == "lm_head.weight") return FillRows(values, head_scale_, &MtpTestTokens::HeadVectorToken);
  for (int64_t j = 0; j < num_mtp_layers_; ++j) {
    const std::string prefix = absl::StrCat("model.layers.", num_hidden_layers_ + j, ".");
    if (!name.starts_with(prefix)) continue;
    const std::string_view rest = std::string_view(name).substr(prefix.size());
    if (rest == "embed_tokens.weight") return FillRows(values, 1.0f, &MtpTestTokens::MtpVectorToken);
    if (rest == "shared_head.head.weight") return FillRows(values, head_scale_, &MtpTestTokens::HeadVectorToken);
    if (rest == "eh_proj.weight") {
      // [I | 0] on concat(enorm(embedding), hnorm(hidden)), plus the drawn values scaled
      // down as noise: the MTP hidden state is the given token's normalized embedding.
      const int64_t hidden = shape[0], cols = shape[1];
      for (float& v : values) v *= kMtpTestLayerOutputScale;
      for (int64_t i = 0; i < hidden; ++i) values[static_cast<size_t>(i * cols + i)] += 1.0f;
    }
    return;
  }
}

}  // namespace tandem
