// Loading V4 weights: the three namings give the same values, the stored formats decode
// as the OCP/DeepSeek definitions say (values worked out by hand here), and bad
// checkpoints are errors that name the tensor.
#include "engine/model/deepseek_v4/v4_weights.h"

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "engine/model/safetensors.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

struct StoredTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
using TensorMap = std::map<std::string, StoredTensor>;

TensorMap ReadAll(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir, AcceptedDTypes::kAll);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  TensorMap out;
  for (const auto& [name, view] : (*ckpt)->tensors()) {
    out[name] = {view->dtype, view->shape, std::vector<std::byte>(view->bytes.begin(), view->bytes.end())};
  }
  return out;
}

// Writes `tensors` as a one-file checkpoint in `dir` with `src`'s config.json.
void WriteAll(const TensorMap& tensors, const std::string& src, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  SafetensorsWriter w;
  for (const auto& [name, t] : tensors) w.Add(name, t.dtype, t.shape, t.bytes);
  ASSERT_TRUE(w.WriteFile(dir + "/model.safetensors").ok());
}

DeepseekV4Config Config(const std::string& dir) {
  absl::StatusOr<DeepseekV4Config> c = LoadDeepseekV4Config(dir);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(DeepseekV4Config{});
}

absl::StatusOr<std::unique_ptr<LoadedWeights>> Load(const std::string& dir) {
  return LoadedWeights::Load(Config(dir), dir);
}

std::vector<float> Values(const WeightMatrix& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  cpu::DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

// Every matrix and vector of two loads, compared value by value.
void ExpectSameWeights(const ModelWeights& a, const ModelWeights& b, const DeepseekV4Config& c) {
  auto same_matrix = [](const WeightMatrix& x, const WeightMatrix& y, const std::string& what) {
    ASSERT_EQ(x.rows, y.rows) << what;
    ASSERT_EQ(x.cols, y.cols) << what;
    EXPECT_EQ(Values(x), Values(y)) << what;
  };
  auto same_vector = [](const float* x, const float* y, int64_t n, const std::string& what) {
    ASSERT_NE(x, nullptr) << what;
    ASSERT_NE(y, nullptr) << what;
    EXPECT_EQ(std::vector<float>(x, x + n), std::vector<float>(y, y + n)) << what;
  };
  same_matrix(a.embed, b.embed, "embed");
  same_matrix(a.head, b.head, "head");
  same_matrix(a.hc_head.fn, b.hc_head.fn, "hc_head.fn");
  same_vector(a.norm, b.norm, c.hidden_size, "norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights& x = a.layers[i];
    const LayerWeights& y = b.layers[i];
    const std::string l = "layer " + std::to_string(i) + " ";
    same_vector(x.attn_norm, y.attn_norm, c.hidden_size, l + "attn_norm");
    same_vector(x.attn_hc.base, y.attn_hc.base, (2 + c.hc_mult) * c.hc_mult, l + "attn_hc.base");
    same_matrix(x.ffn_hc.fn, y.ffn_hc.fn, l + "ffn_hc.fn");
    same_matrix(x.attention.q_b_proj, y.attention.q_b_proj, l + "q_b_proj");
    same_vector(x.attention.kv_norm, y.attention.kv_norm, c.head_dim, l + "kv_norm");
    same_vector(x.attention.sinks, y.attention.sinks, c.num_attention_heads, l + "sinks");
    ASSERT_EQ(x.attention.o_a_groups.size(), y.attention.o_a_groups.size());
    for (size_t g = 0; g < x.attention.o_a_groups.size(); ++g) {
      same_matrix(x.attention.o_a_groups[g], y.attention.o_a_groups[g], l + "o_a group");
    }
    ASSERT_EQ(x.attention.compressor.has_value(), y.attention.compressor.has_value());
    if (x.attention.compressor) {
      same_matrix(x.attention.compressor->gate_proj, y.attention.compressor->gate_proj, l + "compressor.gate");
      same_vector(x.attention.compressor->norm, y.attention.compressor->norm, c.head_dim, l + "compressor.norm");
    }
    ASSERT_EQ(x.attention.indexer.has_value(), y.attention.indexer.has_value());
    if (x.attention.indexer) {
      same_matrix(x.attention.indexer->weights_proj, y.attention.indexer->weights_proj, l + "weights_proj");
      same_vector(x.attention.indexer->compressor.position_bias, y.attention.indexer->compressor.position_bias,
                  c.compress_rate_csa * 2 * c.index_head_dim, l + "indexer.position_bias");
    }
    same_matrix(x.moe.router, y.moe.router, l + "router");
    ASSERT_EQ(x.moe.experts.size(), y.moe.experts.size());
    for (size_t e = 0; e < x.moe.experts.size(); ++e) {
      same_matrix(x.moe.experts[e].gate, y.moe.experts[e].gate, l + "expert gate");
      same_matrix(x.moe.experts[e].up, y.moe.experts[e].up, l + "expert up");
      same_matrix(x.moe.experts[e].down, y.moe.experts[e].down, l + "expert down");
    }
    same_matrix(x.moe.shared.down, y.moe.shared.down, l + "shared down");
    EXPECT_EQ(x.moe.tid2eid != nullptr, y.moe.tid2eid != nullptr);
    if (x.moe.tid2eid != nullptr) {
      const int64_t n = c.vocab_size * c.num_experts_per_tok;
      EXPECT_EQ(std::vector<int32_t>(x.moe.tid2eid, x.moe.tid2eid + n), std::vector<int32_t>(y.moe.tid2eid, y.moe.tid2eid + n));
    }
  }
}

TEST(V4WeightsTest, TransformersSavedNamesLoad) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "m", TinyV4Json().dump(), DType::kF32);
  absl::StatusOr<std::unique_ptr<LoadedWeights>> w = Load(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->weights().naming, TensorNaming::kTransformersSaved);
  EXPECT_TRUE((*w)->weights().unused_tensors.empty());
  EXPECT_TRUE((*w)->weights().mtp.empty());
  ASSERT_EQ((*w)->weights().layers.size(), 4u);
  EXPECT_TRUE((*w)->weights().layers[1].attention.indexer.has_value());
  EXPECT_TRUE((*w)->weights().layers[2].attention.compressor.has_value());
  EXPECT_FALSE((*w)->weights().layers[2].attention.indexer.has_value());
  EXPECT_FALSE((*w)->weights().layers[0].attention.compressor.has_value());
  EXPECT_NE((*w)->weights().layers[0].moe.tid2eid, nullptr);
  EXPECT_NE((*w)->weights().layers[3].moe.correction_bias, nullptr);
}

TEST(V4WeightsTest, OfficialNamesLoadWithTheMtpLayer) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "m", TinyV4Json().dump(), DType::kF8E4M3, /*shards=*/2);
  absl::StatusOr<std::unique_ptr<LoadedWeights>> w = Load(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& mw = (*w)->weights();
  EXPECT_EQ(mw.naming, TensorNaming::kOfficial);
  EXPECT_TRUE(mw.unused_tensors.empty());
  ASSERT_EQ(mw.mtp.size(), 1u);
  EXPECT_FALSE(mw.mtp[0].block.attention.compressor.has_value());
  EXPECT_NE(mw.mtp[0].block.moe.correction_bias, nullptr);
  EXPECT_EQ(mw.mtp[0].block.moe.experts.size(), 8u);
  // e_proj, h_proj and their scales, 3 norms, hc_head, and the block.
  EXPECT_GT(mw.mtp[0].tensors.size(), 50u);
  EXPECT_NE(std::find(mw.mtp[0].tensors.begin(), mw.mtp[0].tensors.end(), "mtp.0.e_proj.scale"), mw.mtp[0].tensors.end());
}

TEST(V4WeightsTest, AllThreeNamingsGiveTheSameWeights) {
  TempDir tmp;
  const std::string saved = MakeV4Model(tmp, "saved", TinyV4Json().dump(), DType::kBF16);
  const TensorMap tensors = ReadAll(saved);
  const DeepseekV4Config c = Config(saved);
  // Back to the official names, and on to transformers' module names (experts fused).
  TensorMap official, modules;
  std::map<std::string, std::string> saved_to_official;
  for (const auto& [name, t] : tensors) {
    std::string o = name;
    if (o == "model.embed_tokens.weight") o = "embed.weight";
    else if (o == "model.norm.weight") o = "norm.weight";
    else if (o.starts_with("model.hc_head.")) o = "hc_head_" + o.substr(std::strlen("model.hc_head.hc_"));
    else if (o.starts_with("model.")) o = o.substr(6);
    if (o.ends_with(".attn.norm.weight")) o = o.substr(0, o.size() - std::strlen("norm.weight")) + "kv_norm.weight";
    official[o] = t;
    saved_to_official[name] = o;
  }
  for (const auto& [name, t] : official) {
    const std::vector<std::string> names = CandidateNames(TensorNaming::kTransformersModules, name);
    if (!names.empty()) modules[names.front()] = t;
  }
  const int64_t inter = c.moe_intermediate_size, d = c.hidden_size, e = c.n_routed_experts;
  TensorMap saved_fused;  // saved names with the experts left fused (under ffn.)
  for (const auto& [name, t] : tensors) {
    if (name.find(".ffn.experts.") == std::string::npos) saved_fused[name] = t;
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    StoredTensor gate_up{DType::kBF16, {e, 2 * inter, d}, {}}, down{DType::kBF16, {e, d, inter}, {}};
    for (int64_t x = 0; x < e; ++x) {
      const std::string p = "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(x) + ".";
      for (const char* w : {"w1", "w3"}) {
        const auto& b = official.at(p + w + ".weight").bytes;
        gate_up.bytes.insert(gate_up.bytes.end(), b.begin(), b.end());
      }
      const auto& b = official.at(p + "w2.weight").bytes;
      down.bytes.insert(down.bytes.end(), b.begin(), b.end());
    }
    modules[FusedExperts(TensorNaming::kTransformersModules, l).front().gate_up] = gate_up;
    modules[FusedExperts(TensorNaming::kTransformersModules, l).front().down] = down;
    saved_fused[FusedExperts(TensorNaming::kTransformersSaved, l).front().gate_up] = gate_up;
    saved_fused[FusedExperts(TensorNaming::kTransformersSaved, l).front().down] = down;
  }
  EXPECT_TRUE(saved_fused.contains("model.layers.0.ffn.experts.gate_up_proj"));
  // A few module names spelled out, as shared/models/deepseek-v4.md §4.2 lists them.
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.hc_head.hc_fn",
                           "model.layers.0.input_layernorm.weight", "model.layers.0.attn_hc.fn",
                           "model.layers.0.self_attn.q_a_norm.weight", "model.layers.0.self_attn.sinks",
                           "model.layers.1.self_attn.compressor.position_bias",
                           "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight",
                           "model.layers.1.self_attn.compressor.indexer.kv_norm.weight",
                           "model.layers.2.mlp.gate.e_score_correction_bias", "model.layers.0.mlp.gate.tid2eid",
                           "model.layers.3.mlp.shared_experts.up_proj.weight"}) {
    EXPECT_TRUE(modules.contains(name)) << name;
  }
  WriteAll(official, saved, tmp.Sub("official"));
  WriteAll(modules, saved, tmp.Sub("modules"));
  WriteAll(saved_fused, saved, tmp.Sub("saved_fused"));
  absl::StatusOr<std::unique_ptr<LoadedWeights>> a = Load(saved);
  absl::StatusOr<std::unique_ptr<LoadedWeights>> b = Load(tmp.Sub("official"));
  absl::StatusOr<std::unique_ptr<LoadedWeights>> m = Load(tmp.Sub("modules"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*b)->weights().naming, TensorNaming::kOfficial);
  EXPECT_EQ((*m)->weights().naming, TensorNaming::kTransformersModules);
  EXPECT_TRUE((*m)->weights().unused_tensors.empty());
  ExpectSameWeights((*a)->weights(), (*b)->weights(), c);
  ExpectSameWeights((*a)->weights(), (*m)->weights(), c);
  absl::StatusOr<std::unique_ptr<LoadedWeights>> f = Load(tmp.Sub("saved_fused"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->weights().unused_tensors.empty());
  ExpectSameWeights((*a)->weights(), (*f)->weights(), c);
}

TEST(V4WeightsTest, Fp4AndFp8DecodeAsSpecified) {
  TempDir tmp;
  const std::string src = MakeV4Model(tmp, "fp8", TinyV4Json().dump(), DType::kF8E4M3);
  TensorMap t = ReadAll(src);
  // FP4 e2m1, two per byte, low nibble first; scale 2^(e - 127).
  // Row 0 bytes 0x21, 0xF7, 0x9C: codes 1, 2, 7, 15, 12, 9 = 0.5, 1, 6, -6, -2, -0.5.
  StoredTensor& w1 = t.at("layers.2.ffn.experts.1.w1.weight");
  StoredTensor& s1 = t.at("layers.2.ffn.experts.1.w1.scale");
  ASSERT_EQ(w1.dtype, DType::kI8);
  std::fill(w1.bytes.begin(), w1.bytes.end(), std::byte{0});
  w1.bytes[0] = std::byte{0x21};
  w1.bytes[1] = std::byte{0xF7};
  w1.bytes[2] = std::byte{0x9C};
  w1.bytes[16] = std::byte{0x30};  // row 0, columns 32 and 33: codes 0 and 3, second scale group
  s1.bytes[0] = std::byte{128};    // row 0, columns 0-31: x2
  s1.bytes[1] = std::byte{125};    // row 0, columns 32-63: x1/4
  // FP8 e4m3 0x38 = 1.0, 0xB4 = -0.75, 0x01 = 2^-9 (smallest subnormal); block scale 2^-1.
  StoredTensor& wq = t.at("layers.0.attn.wq_a.weight");
  StoredTensor& sq = t.at("layers.0.attn.wq_a.scale");
  wq.bytes[0] = std::byte{0x38};
  wq.bytes[1] = std::byte{0xB4};
  wq.bytes[2] = std::byte{0x01};
  sq.bytes[0] = std::byte{126};
  WriteAll(t, src, tmp.Sub("edited"));
  absl::StatusOr<std::unique_ptr<LoadedWeights>> w = Load(tmp.Sub("edited"));
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<float> e = Values((*w)->weights().layers[2].moe.experts[1].gate);
  EXPECT_EQ(std::vector<float>(e.begin(), e.begin() + 6), (std::vector<float>{1.0f, 2.0f, 12.0f, -12.0f, -4.0f, -1.0f}));
  EXPECT_EQ(e[6], 0.0f);
  EXPECT_EQ(e[32], 0.0f);
  EXPECT_EQ(e[33], 1.5f / 4);
  const std::vector<float> q = Values((*w)->weights().layers[0].attention.q_a_proj);
  EXPECT_EQ(q[0], 0.5f);
  EXPECT_EQ(q[1], -0.375f);
  EXPECT_EQ(q[2], std::ldexp(1.0f, -10));
  for (uint8_t code = 0; code < 16; ++code) {
    static constexpr float kOcp[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
    EXPECT_EQ(Fp4E2m1ToF32(code), kOcp[code]) << int(code);
  }
}

// Loads `src` with one edit applied and returns the error.
absl::Status LoadEdited(const TempDir& tmp, const std::string& src, const std::function<void(TensorMap&)>& edit) {
  TensorMap t = ReadAll(src);
  edit(t);
  const std::string dir = tmp.Sub("edited");
  std::filesystem::remove_all(dir);
  WriteAll(t, src, dir);
  return Load(dir).status();
}

void ExpectNames(const absl::Status& s, const std::string& tensor) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'" + tensor + "'"), std::string::npos) << s;
}

TEST(V4WeightsTest, BadTensorsAreErrorsNamingThem) {
  TempDir tmp;
  const std::string saved = MakeV4Model(tmp, "saved", TinyV4Json().dump(), DType::kF32);
  const std::string official = MakeV4Model(tmp, "official", TinyV4Json().dump(), DType::kF8E4M3);
  ExpectNames(LoadEdited(tmp, saved, [](TensorMap& t) { t.erase("model.layers.1.attn.indexer.compressor.ape"); }),
              "model.layers.1.attn.indexer.compressor.ape");
  ExpectNames(LoadEdited(tmp, saved,
                         [](TensorMap& t) {
                           StoredTensor& x = t.at("model.layers.2.attn.wq_b.weight");
                           x.shape = {x.shape[1], x.shape[0]};
                         }),
              "model.layers.2.attn.wq_b.weight");
  ExpectNames(LoadEdited(tmp, saved,
                         [](TensorMap& t) {
                           StoredTensor& x = t.at("model.layers.0.ffn.gate.tid2eid");
                           const int64_t bad = 8;  // one past the last expert
                           std::memcpy(x.bytes.data() + 8 * 5, &bad, 8);
                         }),
              "model.layers.0.ffn.gate.tid2eid");
  ExpectNames(LoadEdited(tmp, saved,
                         [](TensorMap& t) {
                           StoredTensor& x = t.at("model.layers.0.attn.attn_sink");
                           x = {DType::kI32, x.shape, std::vector<std::byte>(x.bytes.size())};
                         }),
              "model.layers.0.attn.attn_sink");
  ExpectNames(LoadEdited(tmp, official, [](TensorMap& t) { t.erase("layers.3.attn.wo_b.scale"); }),
              "layers.3.attn.wo_b.weight");
  ExpectNames(LoadEdited(tmp, official, [](TensorMap& t) { t.erase("layers.0.ffn.experts.6.w3.scale"); }),
              "layers.0.ffn.experts.6.w3.weight");
  ExpectNames(LoadEdited(tmp, official,
                         [](TensorMap& t) { t.at("layers.1.attn.wkv.scale").bytes[0] = std::byte{0xff}; }),
              "layers.1.attn.wkv.scale");  // e8m0 0xff is NaN
  ExpectNames(LoadEdited(tmp, official,
                         [](TensorMap& t) {
                           StoredTensor& x = t.at("layers.0.ffn.experts.0.w2.weight");
                           x.shape = {x.shape[0] / 2, x.shape[1] * 2};
                         }),
              "layers.0.ffn.experts.0.w2.weight");
  // Names of no known kind.
  absl::Status unknown = LoadEdited(tmp, saved, [](TensorMap& t) {
    TensorMap renamed;
    for (auto& [name, x] : t) renamed["transformer." + name] = x;
    t = renamed;
  });
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  EXPECT_NE(unknown.message().find("known naming"), std::string::npos) << unknown;
  // A tensor nothing uses is reported, not fatal.
  TensorMap t = ReadAll(saved);
  t["model.layers.0.extra"] = t.at("model.norm.weight");
  WriteAll(t, saved, tmp.Sub("extra"));
  absl::StatusOr<std::unique_ptr<LoadedWeights>> w = Load(tmp.Sub("extra"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->weights().unused_tensors, std::vector<std::string>{"model.layers.0.extra"});
}

TEST(V4WeightsTest, TensorNames) {
  EXPECT_EQ(CandidateNames(TensorNaming::kOfficial, "layers.3.attn.wq_a.weight"),
            std::vector<std::string>{"layers.3.attn.wq_a.weight"});
  EXPECT_EQ(CandidateNames(TensorNaming::kTransformersSaved, "layers.3.attn.kv_norm.weight").front(),
            "model.layers.3.attn.norm.weight");
  EXPECT_EQ(CandidateNames(TensorNaming::kTransformersSaved, "hc_head_scale"),
            std::vector<std::string>{"model.hc_head.hc_scale"});
  EXPECT_EQ(CandidateNames(TensorNaming::kTransformersModules, "layers.1.attn.indexer.wq_b.weight"),
            std::vector<std::string>{"model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"});
  EXPECT_EQ(CandidateNames(TensorNaming::kTransformersModules, "layers.1.attn.compressor.norm.weight"),
            std::vector<std::string>{"model.layers.1.self_attn.compressor.kv_norm.weight"});
  EXPECT_EQ(CandidateNames(TensorNaming::kTransformersModules, "layers.0.ffn.shared_experts.w2.weight"),
            std::vector<std::string>{"model.layers.0.mlp.shared_experts.down_proj.weight"});
  EXPECT_TRUE(CandidateNames(TensorNaming::kTransformersModules, "layers.0.ffn.experts.2.w1.weight").empty());
  EXPECT_EQ(ScaleNames("layers.0.attn.wq_a.weight"),
            (std::vector<std::string>{"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.weight_scale_inv"}));
}

}  // namespace
}  // namespace tandem::v4
