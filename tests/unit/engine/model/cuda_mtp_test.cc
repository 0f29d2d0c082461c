// The MTP layer on the GPU against the CPU (docs/speculative-decoding.md), on a make-model
// --mtp-acceptance checkpoint of the tiny shape: its drafts win by several nats
// (engine/model/mtp_test_model.h), so the GPU's bf16 roundings cannot flip one and the two
// must draft the same tokens. The MTP layer's KV entries must be the CPU's within what a
// bf16 cache and bf16 GEMM inputs allow: 2 % of an entry's size (a slot read or written one
// off, or the wrong token, is off by its whole size). Skips, saying why, without a GPU.
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/model/cuda/cuda_deepseek_model.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/model_generator.h"
#include "engine/model/mtp_test_model.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

constexpr int kPrompt = 150;

TEST(CudaMtpTest, SlotsAndDraftsMatchTheCpu) {
  std::vector<cuda::DeviceInfo> devices;
  if (const std::string why = cuda::QueryDevices(&devices); !why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  testing::TempDir tmp;
  const std::string dir = testing::MakeMtpTestModel(tmp, "m", 1024, /*seed=*/5, 0.75);
  const MtpTestTokens tokens = testing::MtpTestTokensOf(dir);

  absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu = DeepseekModel::Load(dir, {.num_threads = 4, .mtp = true});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CudaDeepseekModel::LoadOptions go;
  go.max_batch_tokens = 512;
  go.max_seqs = 8;
  go.max_context = 1024;
  go.kv_blocks = 16;
  go.mtp = true;
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> gpu = CudaDeepseekModel::Load(dir, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->has_mtp());
  const int64_t layers = (*cpu)->config().num_hidden_layers, entry = (*cpu)->config().kv_entry_dim();
  ASSERT_EQ((*gpu)->kv_pool().num_layers, layers + 1);

  // A prompt of regular tokens, its own successor chain from a random start.
  std::vector<int32_t> prompt;
  int32_t t = 3;
  while (!tokens.IsRegular(t)) ++t;
  for (int i = 0; i <= kPrompt; ++i) {
    prompt.push_back(t);
    t = tokens.Successor(t);
  }
  const std::vector<int32_t> table = {3, 0, 2, 1};
  LatentKvCache cache(layers + 1, 4, entry);
  // Two chunks: the first knows the token after it, the second keeps its hidden states.
  for (const auto& [begin, end] : std::vector<std::pair<int, int>>{{0, 64}, {64, kPrompt}}) {
    ForwardSequence s{.tokens = std::span<const int32_t>(prompt.data() + begin, end - begin),
                      .start_position = begin,
                      .block_table = table,
                      .mtp = true,
                      .mtp_next_token = end < kPrompt ? prompt[end] : -1,
                      .keep_hidden = end == kPrompt};
    ASSERT_TRUE((*cpu)->Forward({&s, 1}, cache).ok());
    absl::StatusOr<std::vector<float>> g = (*gpu)->Forward({&s, 1});
    ASSERT_TRUE(g.ok()) << g.status();
  }
  std::vector<float> gpu_slots(static_cast<size_t>((kPrompt - 1) * entry));
  ASSERT_TRUE((*gpu)->ReadKvEntries(layers, table, 1, kPrompt - 1, gpu_slots.data()).ok());
  double worst = 0.0;
  for (int q = 1; q < kPrompt; ++q) {
    const float* c = cache.Entry(layers, table, q);
    const float* g = &gpu_slots[static_cast<size_t>(q - 1) * entry];
    double diff = 0.0, size = 0.0;
    for (int64_t i = 0; i < entry; ++i) {
      diff += (static_cast<double>(g[i]) - c[i]) * (static_cast<double>(g[i]) - c[i]);
      size += static_cast<double>(c[i]) * c[i];
    }
    worst = std::max(worst, std::sqrt(diff / size));
  }
  std::printf("MTP slots 1..%d: worst relative L2 difference %.4f\n", kPrompt - 1, worst);
  EXPECT_LT(worst, 0.02);

  // Slot 150 from the kept hidden state of position 149, then 3 chained drafts.
  DraftSequence d{.first_slot = kPrompt, .tokens = std::span<const int32_t>(prompt.data() + kPrompt, 1),
                  .hidden_row = kPrompt - 64 - 1, .block_table = table, .max_drafts = 3};
  absl::StatusOr<std::vector<std::vector<DraftToken>>> want = (*cpu)->Draft({&d, 1}, cache);
  absl::StatusOr<std::vector<std::vector<DraftToken>>> got = (*gpu)->Draft({&d, 1});
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ((*want)[0].size(), 3u);
  ASSERT_EQ((*got)[0].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    std::printf("draft %zu: cpu %d (%.4f), gpu %d (%.4f)\n", i, (*want)[0][i].token, (*want)[0][i].confidence,
                (*got)[0][i].token, (*got)[0][i].confidence);
    EXPECT_EQ((*got)[0][i].token, (*want)[0][i].token) << "draft " << i;
    EXPECT_NEAR((*got)[0][i].confidence, (*want)[0][i].confidence, 0.02) << "draft " << i;
  }
  // The hidden state a prefill replica would hand over is the CPU's within bf16 GEMM inputs.
  absl::StatusOr<std::vector<float>> h = (*gpu)->KeptHidden(kPrompt - 64 - 1);
  ASSERT_TRUE(h.ok()) << h.status();
  const std::span<const float> ch = (*cpu)->kept_hidden().subspan(static_cast<size_t>(kPrompt - 64 - 1) *
                                                                     (*cpu)->config().hidden_size,
                                                                 (*cpu)->config().hidden_size);
  double diff = 0.0, size = 0.0;
  for (size_t i = 0; i < ch.size(); ++i) {
    diff += ((*h)[i] - ch[i]) * ((*h)[i] - ch[i]);
    size += ch[i] * ch[i];
  }
  EXPECT_LT(std::sqrt(diff / size), 0.02);
}

// make-model --mtp-acceptance --weights-on-gpu writes config.json (with the construction's
// record) and the tokenizer only; the CUDA backend builds the same weights at load as the
// checkpoint make-model writes without it: the same logits (up to the order of float32
// atomic sums, 1e-3 of the largest) and the same drafts.
TEST(CudaMtpTest, TheConstructionGeneratedOnTheGpuIsTheCheckpoints) {
  std::vector<cuda::DeviceInfo> devices;
  if (const std::string why = cuda::QueryDevices(&devices); !why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  testing::TempDir tmp;
  testing::MakeMtpTestModel(tmp, "ckpt", 1024, /*seed=*/9, 0.6);
  testing::MakeMtpTestModel(tmp, "gen", 1024, /*seed=*/9, 0.6, /*write_weights=*/false);
  absl::StatusOr<std::string> text = ReadFileToString(tmp.Sub("gen") + "/config.json");
  ASSERT_TRUE(text.ok());
  CudaDeepseekModel::LoadOptions go;
  go.max_batch_tokens = 256;
  go.max_seqs = 4;
  go.max_context = 512;
  go.kv_blocks = 8;
  go.mtp = true;
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> loaded = CudaDeepseekModel::Load(tmp.Sub("ckpt"), go);
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> generated = CudaDeepseekModel::CreateGenerated(*text, 9, go);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(generated.ok()) << generated.status();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(5 + (i * 37) % 900);
  const std::vector<int32_t> table = {0, 1};
  ForwardSequence s{.tokens = prompt, .block_table = table, .all_logits = true, .mtp = true, .keep_hidden = true};
  absl::StatusOr<std::vector<float>> a = (*loaded)->Forward({&s, 1});
  absl::StatusOr<std::vector<float>> b = (*generated)->Forward({&s, 1});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  double worst = 0.0, largest = 0.0;
  for (size_t i = 0; i < a->size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>((*a)[i]) - (*b)[i]));
    largest = std::max(largest, std::fabs(static_cast<double>((*a)[i])));
  }
  EXPECT_LE(worst, 1e-3 * largest);
  const int32_t next = 7;
  DraftSequence d{.first_slot = 40, .tokens = std::span<const int32_t>(&next, 1), .hidden_row = 39,
                  .block_table = table, .max_drafts = 3};
  absl::StatusOr<std::vector<std::vector<DraftToken>>> da = (*loaded)->Draft({&d, 1});
  absl::StatusOr<std::vector<std::vector<DraftToken>>> db = (*generated)->Draft({&d, 1});
  ASSERT_TRUE(da.ok() && db.ok()) << da.status() << " " << db.status();
  ASSERT_EQ((*da)[0].size(), (*db)[0].size());
  for (size_t i = 0; i < (*da)[0].size(); ++i) EXPECT_EQ((*da)[0][i].token, (*db)[0][i].token) << i;
}

}  // namespace
}  // namespace tandem
