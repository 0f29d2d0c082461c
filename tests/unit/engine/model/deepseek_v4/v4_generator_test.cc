// The V4 checkpoint generator: names and formats per --dtype (transformers-saved names of
// shared/models/deepseek-v4.md §4.3 for f32/bf16, official names and formats of §4.1 for
// fp8), determinism, sharding, and that quantized values are the f32 values rounded.
#include "engine/model/deepseek_v4/v4_generator.h"

#include <cmath>
#include <filesystem>

#include "engine/model/checkpoint.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "kernels/cpu/weight_matrix.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

std::unique_ptr<Checkpoint> Open(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::Open(dir, AcceptedDTypes::kAll);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<float> Rows(const WeightMatrix& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  cpu::DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

TEST(V4GeneratorTest, PresetParsesAndCoversEveryMechanism) {
  absl::StatusOr<DeepseekV4Config> c = ParseDeepseekV4Config(TinyV4Json().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  bool sliding = false, csa = false, hca = false, hash = false, topk = false;
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    sliding |= c->layer_types[i] == AttentionType::kSliding;
    csa |= c->layer_types[i] == AttentionType::kCompressedSparse;
    hca |= c->layer_types[i] == AttentionType::kHeavilyCompressed;
    hash |= c->mlp_layer_types[i] == MlpType::kHashMoe;
    topk |= c->mlp_layer_types[i] == MlpType::kMoe;
  }
  EXPECT_TRUE(sliding && csa && hca && hash && topk);
  EXPECT_GE(c->hc_mult, 2);
  EXPECT_GE(c->index_n_heads, 8);
  // A prompt of 300 tokens has more CSA entries than the indexer keeps, several HCA
  // windows and many sliding windows.
  EXPECT_LT(c->index_topk, 300 / c->compress_rate_csa);
  EXPECT_GE(300 / c->compress_rate_hca, 8);
  EXPECT_LE(c->sliding_window, 16);
  EXPECT_TRUE(c->compress_rope.rope.yarn);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
}

TEST(V4GeneratorTest, F32UsesTheNamesTransformersSaves) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "f32", TinyV4Json().dump(), DType::kF32);
  std::unique_ptr<Checkpoint> ckpt = Open(dir);
  ASSERT_NE(ckpt, nullptr);
  for (const char* name : {"model.embed_tokens.weight", "head.weight", "model.norm.weight", "model.hc_head.hc_fn",
                           "model.hc_head.hc_base", "model.hc_head.hc_scale", "model.layers.0.attn_norm.weight",
                           "model.layers.0.hc_attn_fn", "model.layers.0.attn.wq_a.weight",
                           "model.layers.0.attn.norm.weight",  // the attention's kv_norm, as save_pretrained writes it
                           "model.layers.0.attn.attn_sink", "model.layers.0.ffn.gate.tid2eid",
                           "model.layers.0.ffn.experts.7.w2.weight", "model.layers.1.attn.compressor.ape",
                           "model.layers.1.attn.indexer.compressor.norm.weight",
                           "model.layers.1.attn.indexer.weights_proj.weight", "model.layers.2.attn.compressor.wgate.weight",
                           "model.layers.2.ffn.gate.bias", "model.layers.3.ffn.shared_experts.w3.weight"}) {
    const TensorView* t = ckpt->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, std::string(name).ends_with("tid2eid") ? DType::kI64 : DType::kF32) << name;
  }
  EXPECT_EQ(ckpt->Find("model.layers.0.attn.kv_norm.weight"), nullptr);
  EXPECT_EQ(ckpt->Find("mtp.0.e_proj.weight"), nullptr);  // transformers never saves MTP layers
  EXPECT_EQ(ckpt->Find("model.layers.2.attn.indexer.wq_b.weight"), nullptr);  // HCA: no indexer
  EXPECT_EQ(ckpt->Find("model.layers.0.attn.compressor.wkv.weight"), nullptr);  // sliding: no compressor
  EXPECT_EQ(ckpt->Find("model.layers.2.attn.compressor.ape")->shape, (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(ckpt->Find("model.layers.1.attn.compressor.ape")->shape, (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(ckpt->Find("model.layers.1.attn.indexer.compressor.wkv.weight")->shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(ckpt->Find("model.layers.0.hc_attn_fn")->shape, (std::vector<int64_t>{24, 256}));
  EXPECT_EQ(ckpt->Find("model.layers.0.attn.wo_a.weight")->shape, (std::vector<int64_t>{32, 128}));
}

TEST(V4GeneratorTest, Bf16KeepsTransformersFp32ModulesInFloat32) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "bf16", TinyV4Json().dump(), DType::kBF16);
  std::unique_ptr<Checkpoint> ckpt = Open(dir);
  ASSERT_NE(ckpt, nullptr);
  EXPECT_EQ(ckpt->Find("model.layers.0.attn.wq_a.weight")->dtype, DType::kBF16);
  EXPECT_EQ(ckpt->Find("model.layers.0.ffn.experts.0.w1.weight")->dtype, DType::kBF16);
  for (const char* name : {"model.layers.0.hc_attn_fn", "model.layers.0.attn.attn_sink", "model.layers.2.ffn.gate.bias",
                           "model.layers.1.attn.compressor.ape", "model.layers.0.attn_norm.weight",
                           "model.layers.0.attn.q_norm.weight", "model.norm.weight", "model.hc_head.hc_fn"}) {
    EXPECT_EQ(ckpt->Find(name)->dtype, DType::kF32) << name;
  }
}

TEST(V4GeneratorTest, Fp8WritesTheOfficialNamesAndFormats) {
  TempDir tmp;
  const std::string dir = MakeV4Model(tmp, "fp8", TinyV4Json().dump(), DType::kF8E4M3);
  std::unique_ptr<Checkpoint> ckpt = Open(dir);
  ASSERT_NE(ckpt, nullptr);
  auto expect = [&](const std::string& name, DType dtype, std::vector<int64_t> shape) {
    const TensorView* t = ckpt->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
    EXPECT_EQ(t->shape, shape) << name;
  };
  expect("embed.weight", DType::kBF16, {512, 64});
  expect("head.weight", DType::kBF16, {512, 64});
  expect("hc_head_fn", DType::kF32, {4, 256});
  expect("layers.0.attn.wq_a.weight", DType::kF8E4M3, {32, 64});
  expect("layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 1});
  expect("layers.0.attn.wq_b.weight", DType::kF8E4M3, {256, 32});
  expect("layers.0.attn.wq_b.scale", DType::kF8E8M0, {2, 1});
  expect("layers.0.attn.kv_norm.weight", DType::kBF16, {64});
  expect("layers.0.attn.attn_sink", DType::kF32, {4});
  expect("layers.1.attn.compressor.wkv.weight", DType::kBF16, {128, 64});
  expect("layers.1.attn.indexer.wq_b.weight", DType::kF8E4M3, {256, 32});
  expect("layers.1.attn.indexer.weights_proj.weight", DType::kBF16, {8, 64});
  expect("layers.0.ffn.gate.weight", DType::kBF16, {8, 64});
  expect("layers.0.ffn.gate.tid2eid", DType::kI64, {512, 2});
  // Routed experts FP4: [rows, cols / 2] bytes and a ue8m0 scale per 32 inputs.
  expect("layers.0.ffn.experts.3.w1.weight", DType::kI8, {32, 32});
  expect("layers.0.ffn.experts.3.w1.scale", DType::kF8E8M0, {32, 2});
  expect("layers.0.ffn.experts.3.w2.weight", DType::kI8, {64, 16});
  expect("layers.0.ffn.experts.3.w2.scale", DType::kF8E8M0, {64, 1});
  expect("layers.0.ffn.shared_experts.w1.weight", DType::kF8E4M3, {32, 64});
  // The MTP layer: a sliding block with a top-k MoE.
  expect("mtp.0.e_proj.weight", DType::kF8E4M3, {64, 64});
  expect("mtp.0.hc_head_base", DType::kF32, {4});
  expect("mtp.0.ffn.gate.bias", DType::kF32, {8});
  EXPECT_EQ(ckpt->Find("mtp.0.attn.compressor.wkv.weight"), nullptr);
  absl::StatusOr<std::string> config = ReadFileToString(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  absl::StatusOr<DeepseekV4Config> c = ParseDeepseekV4Config(*config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp8_block_quantized);
  EXPECT_EQ(c->expert_dtype, "fp4");
}

TEST(V4GeneratorTest, QuantizedWeightsAreTheFloatWeightsRounded) {
  TempDir tmp;
  const std::string json = TinyV4Json().dump();
  absl::StatusOr<DeepseekV4Config> c = ParseDeepseekV4Config(json);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::unique_ptr<LoadedWeights>> f32 =
      LoadedWeights::Load(*c, MakeV4Model(tmp, "f32", json, DType::kF32));
  absl::StatusOr<std::unique_ptr<LoadedWeights>> fp8 =
      LoadedWeights::Load(*c, MakeV4Model(tmp, "fp8", json, DType::kF8E4M3));
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  // FP8 e4m3 keeps 3 mantissa bits: within 2^-4 relative of each value, or half the
  // subnormal step 2^-9 of a scale below 2 amax / 448. FP4 e2m1: at most half its largest
  // step (2) times a scale below 2 gmax / 6, so gmax / 3.
  const WeightMatrix& a = (*f32)->weights().layers[1].attention.q_b_proj;
  const WeightMatrix& b = (*fp8)->weights().layers[1].attention.q_b_proj;
  EXPECT_EQ(b.dtype, DType::kF8E4M3);
  const std::vector<float> va = Rows(a), vb = Rows(b);
  float amax = 0.0f;
  for (float v : va) amax = std::max(amax, std::fabs(v));
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_LE(std::fabs(va[i] - vb[i]), std::fabs(va[i]) / 16.0f + amax / 448.0f * 0.002f) << i;
  }
  const WeightMatrix& ea = (*f32)->weights().layers[2].moe.experts[5].down;
  const WeightMatrix& eb = (*fp8)->weights().layers[2].moe.experts[5].down;
  EXPECT_EQ(eb.dtype, DType::kBF16);  // FP4 dequantized at load
  const std::vector<float> xa = Rows(ea), xb = Rows(eb);
  for (int64_t r = 0; r < ea.rows; ++r) {
    for (int64_t g = 0; g < ea.cols; g += 32) {
      float gmax = 0.0f;
      for (int64_t k = g; k < std::min(ea.cols, g + 32); ++k) gmax = std::max(gmax, std::fabs(xa[r * ea.cols + k]));
      for (int64_t k = g; k < std::min(ea.cols, g + 32); ++k) {
        ASSERT_LE(std::fabs(xa[r * ea.cols + k] - xb[r * ea.cols + k]), gmax / 3.0f + 1e-30f) << r << "," << k;
      }
    }
  }
  EXPECT_GT((*fp8)->weights().fp8_matrices, 0);
  EXPECT_EQ((*fp8)->weights().fp4_matrices, 4 * 8 * 3 + 8 * 3);  // 4 layers + the MTP layer, 8 experts each
  EXPECT_EQ((*f32)->weights().fp8_matrices, 0);
}

TEST(V4GeneratorTest, DeterministicAndShardable) {
  TempDir tmp;
  const std::string json = TinyV4Json().dump();
  const std::string a = MakeV4Model(tmp, "a", json, DType::kBF16, 1, 3);
  const std::string b = MakeV4Model(tmp, "b", json, DType::kBF16, 1, 3);
  const std::string c = MakeV4Model(tmp, "c", json, DType::kBF16, 1, 4);
  absl::StatusOr<std::string> fa = ReadFileToString(a + "/model.safetensors");
  absl::StatusOr<std::string> fb = ReadFileToString(b + "/model.safetensors");
  absl::StatusOr<std::string> fc = ReadFileToString(c + "/model.safetensors");
  ASSERT_TRUE(fa.ok() && fb.ok() && fc.ok());
  EXPECT_EQ(*fa, *fb);
  EXPECT_NE(*fa, *fc);
  const std::string sharded = MakeV4Model(tmp, "sharded", json, DType::kF8E4M3, 3, 3);
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model-00003-of-00003.safetensors"));
  std::unique_ptr<Checkpoint> ckpt = Open(sharded);
  ASSERT_NE(ckpt, nullptr);
  EXPECT_EQ(ckpt->num_files(), 3u);
}

TEST(V4GeneratorTest, RejectsWhatItCannotWrite) {
  TempDir tmp;
  ModelGeneratorOptions options;
  options.config_json = TinyV4Json().dump();
  options.weight_dtype = DType::kF16;
  EXPECT_EQ(GenerateDeepseekV4Model(options, tmp.Sub("x")).status().code(), absl::StatusCode::kInvalidArgument);
  options.weight_dtype = DType::kBF16;
  options.write_weights = false;
  EXPECT_EQ(GenerateDeepseekV4Model(options, tmp.Sub("x")).status().code(), absl::StatusCode::kInvalidArgument);
  options.write_weights = true;
  nlohmann::json bad = TinyV4Json();
  bad["index_topk"] = 0;
  options.config_json = bad.dump();
  absl::Status s = GenerateDeepseekV4Model(options, tmp.Sub("x")).status();
  EXPECT_NE(s.message().find("'index_topk'"), std::string::npos) << s;
  EXPECT_TRUE(IsDeepseekV4Config(TinyV4Json().dump()));
  EXPECT_FALSE(IsDeepseekV4Config(R"({"model_type": "deepseek_v3"})"));
  EXPECT_FALSE(IsDeepseekV4Config("not json"));
}

}  // namespace
}  // namespace tandem::v4
