// Reading safetensors files and checkpoints: round trips, and every kind of damage
// reported as a clear error rather than a crash or an out-of-bounds read.
#include "engine/model/safetensors.h"

#include <cstring>
#include <random>

#include "engine/model/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::TempDir;

std::vector<std::byte> Bytes(size_t n, uint8_t start = 0) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(start + i);
  return b;
}

std::string TwoTensorFile() {
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.Add("a.weight", DType::kBF16, {2, 3}, Bytes(12));
  w.Add("b.bias", DType::kF32, {5}, Bytes(20, 100));
  return w.Serialize();
}

// A file whose JSON header is `header` (padded), followed by `data_bytes` bytes.
std::string WithHeader(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenContents(const TempDir& dir, const std::string& contents) {
  const std::string path = dir.Sub("x.safetensors");
  EXPECT_TRUE(WriteStringToFile(path, contents).ok());
  return SafetensorsFile::Open(path);
}

TEST(SafetensorsTest, RoundTrip) {
  TempDir dir;
  auto f = OpenContents(dir, TwoTensorFile());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorView& a = (*f)->tensors().at("a.weight");
  EXPECT_EQ(a.dtype, DType::kBF16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.bytes.size(), 12u);
  EXPECT_EQ(a.bytes[5], std::byte{5});
  const TensorView& b = (*f)->tensors().at("b.bias");
  EXPECT_EQ(b.bytes[0], std::byte{100});
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
}

struct Corruption {
  std::string name;
  std::string contents;
  absl::StatusCode code;
  std::string must_mention;
};

std::vector<Corruption> Corruptions() {
  const std::string good = TwoTensorFile();
  return {
      {"empty file", "", absl::StatusCode::kDataLoss, "too short"},
      {"truncated header", good.substr(0, 20), absl::StatusCode::kDataLoss, "past the end"},
      {"truncated data", good.substr(0, good.size() - 3), absl::StatusCode::kDataLoss, "b.bias"},
      {"absurd header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", absl::StatusCode::kInvalidArgument,
       "header length"},
      {"header not json", WithHeader("{\"a\": [1, 2", 0), absl::StatusCode::kInvalidArgument, "JSON"},
      {"header is an array", WithHeader("[1]", 0), absl::StatusCode::kInvalidArgument, "JSON object"},
      {"unknown dtype", WithHeader(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "'I64'"},
      {"size does not match shape", WithHeader(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       absl::StatusCode::kInvalidArgument, "needs 12 bytes"},
      {"negative dimension", WithHeader(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       absl::StatusCode::kInvalidArgument, "dimension"},
      {"overflowing shape",
       WithHeader(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
       absl::StatusCode::kInvalidArgument, "overflows"},
      {"reversed offsets", WithHeader(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       absl::StatusCode::kInvalidArgument, "reversed"},
      {"offsets past the end", WithHeader(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
       absl::StatusCode::kDataLoss, "past the end"},
      {"overlapping tensors",
       WithHeader(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  8),
       absl::StatusCode::kInvalidArgument, "overlap"},
      {"missing field", WithHeader(R"({"t":{"dtype":"F32","shape":[1]}})", 4), absl::StatusCode::kInvalidArgument,
       "data_offsets"},
      {"metadata not strings", WithHeader(R"({"__metadata__":{"a":1}})", 0), absl::StatusCode::kInvalidArgument,
       "__metadata__"},
  };
}

TEST(SafetensorsTest, CorruptFilesAreClearErrors) {
  TempDir dir;
  for (const Corruption& c : Corruptions()) {
    auto f = OpenContents(dir, c.contents);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), c.code) << c.name << ": " << f.status();
    EXPECT_NE(std::string(f.status().message()).find(c.must_mention), std::string::npos)
        << c.name << ": " << f.status().message();
  }
  EXPECT_EQ(SafetensorsFile::Open(dir.Sub("missing.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, RandomDamageNeverCrashes) {
  // Flip, truncate and extend bytes of a valid file many times: every result must either
  // open with all views inside the file, or fail with a status.
  TempDir dir;
  const std::string good = TwoTensorFile();
  std::mt19937 rng(42);
  int opened = 0, failed = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    const int kind = i % 3;
    if (kind == 0) {
      for (int j = 0; j < 3; ++j) bad[rng() % bad.size()] = static_cast<char>(rng());
    } else if (kind == 1) {
      bad.resize(rng() % bad.size());
    } else {
      bad[rng() % std::min<size_t>(bad.size(), 80)] = "0123456789[]{}\",:-"[rng() % 18];
    }
    auto f = OpenContents(dir, bad);
    if (!f.ok()) {
      ++failed;
      continue;
    }
    ++opened;
    for (const auto& [name, view] : (*f)->tensors()) {
      ASSERT_EQ(view.bytes.size(), static_cast<size_t>(view.numel()) * DTypeSize(view.dtype));
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(opened, 0);
}

TEST(CheckpointTest, ShardsThroughIndex) {
  TempDir dir;
  SafetensorsWriter a, b;
  a.Add("x", DType::kF32, {1}, Bytes(4));
  b.Add("y", DType::kF32, {2}, Bytes(8));
  ASSERT_TRUE(a.WriteFile(dir.Sub("s1.safetensors")).ok());
  ASSERT_TRUE(b.WriteFile(dir.Sub("s2.safetensors")).ok());
  ASSERT_TRUE(WriteStringToFile(dir.Sub("model.safetensors.index.json"),
                                R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})")
                  .ok());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->num_files(), 2u);
  ASSERT_NE((*ckpt)->Find("y"), nullptr);
  EXPECT_EQ((*ckpt)->Find("y")->shape, std::vector<int64_t>{2});
  EXPECT_EQ((*ckpt)->Find("z"), nullptr);
}

TEST(CheckpointTest, InconsistentIndexesAreErrors) {
  TempDir dir;
  SafetensorsWriter a;
  a.Add("x", DType::kF32, {1}, Bytes(4));
  ASSERT_TRUE(a.WriteFile(dir.Sub("s1.safetensors")).ok());
  ASSERT_TRUE(a.WriteFile(dir.Sub("s2.safetensors")).ok());
  auto write_index = [&](const std::string& text) {
    ASSERT_TRUE(WriteStringToFile(dir.Sub("model.safetensors.index.json"), text).ok());
  };
  write_index(R"({"weight_map":{"x":"s1.safetensors","w":"s1.safetensors"}})");
  auto c = Checkpoint::Open(dir.path());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("'w'"), std::string::npos) << c.status();

  write_index(R"({"weight_map":{"x":"s1.safetensors","q":"s2.safetensors"}})");
  c = Checkpoint::Open(dir.path());
  EXPECT_NE(std::string(c.status().message()).find("appears in both"), std::string::npos) << c.status();

  write_index(R"({"weight_map":{"x":"missing.safetensors"}})");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kNotFound);

  write_index(R"({"weight_map":{"x":"../etc/passwd"}})");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);

  write_index("not json");
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);

  TempDir empty;
  EXPECT_EQ(Checkpoint::Open(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
