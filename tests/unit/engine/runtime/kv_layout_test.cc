// The model identity in the KV layout fingerprint (kv_layout.h, weights_digest.h): two
// checkpoints of one config that differ only in their weights (as two fine-tunes of one
// base do) must not share KV, so their fingerprints differ; the same checkpoint, wherever
// it lies, keeps its fingerprint.
#include "engine/runtime/kv_layout.h"

#include <filesystem>

#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/model/model_config.h"
#include "engine/model/weights_digest.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::MakeModel;
using testing::PresetJson;
using testing::TempDir;

uint64_t Fingerprint(const std::string& dir) {
  absl::StatusOr<KvLayout> layout = KvLayoutForModel(dir);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? LayoutFingerprint(*layout) : 0;
}

// The safetensors header (8-byte length + JSON: names, dtypes, shapes, offsets).
std::string Header(const std::string& file) {
  absl::StatusOr<std::string> bytes = ReadFileToString(file);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>((*bytes)[i])) << (8 * i);
  return bytes->substr(0, 8 + n);
}

TEST(KvLayoutTest, CheckpointsThatDifferOnlyInWeightsHaveDifferentFingerprints) {
  TempDir tmp;
  const std::string config = PresetJson("tiny");
  const std::string a = MakeModel(tmp, "a", config, /*seed=*/1);
  const std::string b = MakeModel(tmp, "b", config, /*seed=*/2);
  // What the fingerprint used to cover is identical, and so is every safetensors header:
  // only the tensor bytes tell the two apart.
  ASSERT_EQ(*ReadFileToString(a + "/config.json"), *ReadFileToString(b + "/config.json"));
  ASSERT_EQ(Header(a + "/model.safetensors"), Header(b + "/model.safetensors"));
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
  EXPECT_NE(*WeightsDigest(a), *WeightsDigest(b));
}

TEST(KvLayoutTest, TheSameCheckpointKeepsItsFingerprintWhereverItLies) {
  TempDir tmp;
  const std::string a = MakeModel(tmp, "a", PresetJson("tiny"), /*seed=*/1);
  const uint64_t fp = Fingerprint(a);
  EXPECT_EQ(Fingerprint(a), fp);
  const std::string copy = tmp.Sub("elsewhere");
  std::filesystem::copy(a, copy, std::filesystem::copy_options::recursive);
  EXPECT_EQ(Fingerprint(copy), fp);
  // One byte of one tensor changed: another model.
  {
    absl::StatusOr<std::string> bytes = ReadFileToString(copy + "/model.safetensors");
    ASSERT_TRUE(bytes.ok());
    std::string changed = *bytes;
    changed[changed.size() - 3] ^= 0x01;
    ASSERT_TRUE(WriteStringToFile(copy + "/model.safetensors", changed).ok());
  }
  EXPECT_NE(Fingerprint(copy), fp);
}

TEST(KvLayoutTest, ShardedCheckpointsAreHashedWhole) {
  TempDir tmp;
  const std::string config = PresetJson("tiny");
  const std::string a = MakeModel(tmp, "a", config, 1, DType::kBF16, /*shards=*/3);
  const std::string b = MakeModel(tmp, "b", config, 2, DType::kBF16, /*shards=*/3);
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
  EXPECT_EQ(Fingerprint(a), Fingerprint(a));
}

TEST(KvLayoutTest, WithoutWeightsTheFingerprintMustBeGiven) {
  TempDir tmp;
  const std::string a = MakeModel(tmp, "a", PresetJson("tiny"), 1);
  const std::string bare = tmp.Sub("config-only");
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(a + "/config.json", bare + "/config.json");
  absl::StatusOr<uint64_t> missing = AdmittedLayoutFingerprint(bare, "", "--layout-fingerprint");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--layout-fingerprint"), std::string::npos) << missing.status();
  const uint64_t fp = Fingerprint(a);
  absl::StatusOr<uint64_t> given = AdmittedLayoutFingerprint(bare, FingerprintHex(fp), "--layout-fingerprint");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(*given, fp);
  EXPECT_EQ(*AdmittedLayoutFingerprint(a, "", "--layout-fingerprint"), fp);
  for (const char* bad : {"12", "zzzzzzzzzzzzzzzz", "0123456789abcdef0"}) {
    EXPECT_EQ(AdmittedLayoutFingerprint(a, bad, "--layout-fingerprint").status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// V2/V3's layout is one instance of the stream layout: one per-token latent stream on
// every layer, with the block bytes the engine's pool has always had.
TEST(KvLayoutTest, DeepseekV2IsOneLatentStream) {
  TempDir tmp;
  const std::string a = MakeModel(tmp, "a", PresetJson("tiny"), 1);
  absl::StatusOr<KvLayout> layout = KvLayoutForModel(a);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const ModelConfig c = *LoadModelConfig(a);
  EXPECT_EQ(layout->layout_version, kKvLayoutVersion);
  EXPECT_EQ(layout->num_layers, c.num_hidden_layers);
  ASSERT_EQ(layout->streams.size(), 1u);
  const KvStream& latent = layout->streams[0];
  EXPECT_EQ(latent.name, "latent");
  EXPECT_EQ(latent.granularity, KvGranularity::kPerToken);
  EXPECT_EQ(latent.width, c.kv_lora_rank + c.qk_rope_head_dim);
  EXPECT_EQ(static_cast<int64_t>(latent.layers.size()), c.num_hidden_layers);
  EXPECT_EQ(BlockBytes(*layout), c.num_hidden_layers * 64 * c.kv_entry_dim() * 4);
}

// A V4 checkpoint's layout is the streams its architecture declares; its fingerprint can
// never admit a V2/V3 replica's KV (or the reverse), and routers and kvstores can compute it.
TEST(KvLayoutTest, DeepseekV4HasItsStreamsAndItsOwnFingerprint) {
  TempDir tmp;
  const std::string v4 = v4::testing::MakeV4Model(tmp, "v4", v4::testing::TinyV4Json().dump());
  absl::StatusOr<KvLayout> layout = KvLayoutForModel(v4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const v4::DeepseekV4Config c = *v4::LoadDeepseekV4Config(v4);
  const std::vector<KvStream> expected = v4::KvStreamsFor(c);
  ASSERT_EQ(layout->streams.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(layout->streams[i].name, expected[i].name);
    EXPECT_EQ(layout->streams[i].layers, expected[i].layers);
  }
  EXPECT_EQ(layout->model_id.rfind("deepseek_v4:", 0), 0u) << layout->model_id;
  EXPECT_GT(BlockBytes(*layout), 0);
  const std::string v2 = MakeModel(tmp, "v2", PresetJson("tiny"), 1);
  EXPECT_NE(Fingerprint(v4), Fingerprint(v2));
  absl::StatusOr<uint64_t> admitted = AdmittedLayoutFingerprint(v4, "", "--layout-fingerprint");
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(*admitted, Fingerprint(v4));
}

TEST(KvLayoutTest, AnUnknownModelTypeIsNamed) {
  absl::StatusOr<KvLayout> layout = KvLayoutFor(R"({"model_type": "llama"})", 0);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("'llama'"), std::string::npos) << layout.status();
  EXPECT_NE(layout.status().message().find("deepseek_v4"), std::string::npos) << layout.status();
}

}  // namespace
}  // namespace tandem
