// The model identity in the KV layout fingerprint (kv_layout.h, weights_digest.h): two
// checkpoints of one config that differ only in their weights (as two fine-tunes of one
// base do) must not share KV, so their fingerprints differ; the same checkpoint, wherever
// it lies, keeps its fingerprint.
#include "engine/runtime/kv_layout.h"

#include <filesystem>

#include "engine/model/weights_digest.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace tandem
