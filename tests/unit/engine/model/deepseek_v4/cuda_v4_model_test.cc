// DeepSeek-V4 on the GPU (engine/model/deepseek_v4/cuda) against the CPU engine
// (PagedV4Model) on tiny-v4, in float32 and as DeepSeek's FP8 checkpoint (FP8 linears, FP4
// experts; the GPU keeps both narrow, reading them through the FP8/FP4 GEMV in passes of up
// to 8 rows), both engines on the same weight values so that only the order of float sums
// differs: the same batches (prefill chunks next to decode steps, scattered blocks, reused slots)
// give the same top-1 on >= 99.5 % of rows and logits within a relative L2 of 1e-5 (sum
// orders alone move them by about 1e-6); the GPU pool afterwards holds the CPU pool's
// state (rings, compressed entries, indexer keys, unfinished windows) to 1e-4 per value;
// greedy continuations of 10 prompts decoded together are identical. Skips, saying why,
// where no GPU is usable.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "kernels/cuda/fp8_gemm.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem::v4 {
namespace {

using testing::MakeV4Model;
using testing::TempDir;
using testing::TinyV4Json;

constexpr int64_t kVocab = 512;

std::vector<int32_t> Tokens(int64_t n, uint32_t seed) { return testing::RandomTokens(n, seed, kVocab); }

int64_t Argmax(const float* row) { return std::max_element(row, row + kVocab) - row; }

// The checkpoints: tiny-v4 in float32, as DeepSeek's FP8 checkpoint, and the FP8 one with
// q_lora_rank and o_lora_rank at 128 (whole 128-row scale blocks: q_a stays FP8 stacked
// with kv, and the grouped output projection's groups stay FP8).
enum class Checkpoint { kF32, kFp8, kFp8WholeBlocks };

class CudaV4ModelTest : public tandem::testing::GpuTest, public ::testing::WithParamInterface<Checkpoint> {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    dirs_ = new std::map<Checkpoint, std::string>();
    (*dirs_)[Checkpoint::kF32] = MakeV4Model(*tmp_, "tiny-v4", TinyV4Json(kVocab).dump());
    (*dirs_)[Checkpoint::kFp8] = MakeV4Model(*tmp_, "tiny-v4-fp8", TinyV4Json(kVocab).dump(), DType::kF8E4M3);
    nlohmann::json wide = TinyV4Json(kVocab);
    wide["q_lora_rank"] = 128;
    wide["o_lora_rank"] = 128;
    wide["moe_intermediate_size"] = 128;  // the shared expert's gate and up stay FP8 too
    (*dirs_)[Checkpoint::kFp8WholeBlocks] = MakeV4Model(*tmp_, "tiny-v4-fp8-blocks", wide.dump(), DType::kF8E4M3);
  }
  static void TearDownTestSuite() {
    delete dirs_;
    delete tmp_;
  }
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    const std::string& dir = dirs_->at(GetParam());
    absl::StatusOr<std::unique_ptr<PagedV4Model>> cpu = PagedV4Model::Load(dir, {.num_threads = 2});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> gpu = cuda_v4::CudaV4Model::Load(dir, {});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    if (GetParam() != Checkpoint::kF32) {
      ASSERT_GT(gpu_->fp8_matrices(), 0) << "the FP8 checkpoint's linears should stay FP8 on the GPU";
      ASSERT_GT(gpu_->fp4_matrices(), 0) << "the FP8 checkpoint's FP4 experts should stay FP4 on the GPU";
      // The head, routers, compressors and indexer weights.
      ASSERT_GE(gpu_->bf16_matrices(), 1 + 2 * cpu_->config().num_hidden_layers)
          << "the FP8 checkpoint's bf16 matrices should stay bf16 on the GPU";
    }
    if (GetParam() == Checkpoint::kFp8WholeBlocks) {
      // A layer's q_a + kv, q_b, 2 o_a groups, o_b and the shared expert's gate + up and down.
      ASSERT_GE(gpu_->fp8_matrices(), 7 * cpu_->config().num_hidden_layers);
    }
    const KvPool::Geometry g{.num_layers = static_cast<int32_t>(cpu_->config().num_hidden_layers),
                             .block_size = 64, .num_blocks = 32, .num_sequence_slots = 12};
    absl::StatusOr<std::unique_ptr<KvPool>> p = KvPool::Create(cpu_->kv_streams(), g);
    ASSERT_TRUE(p.ok()) << p.status();
    pool_ = std::move(*p);
    ASSERT_TRUE(gpu_->EnsurePool(g).ok());
  }

  static TempDir* tmp_;
  static std::map<Checkpoint, std::string>* dirs_;
  std::unique_ptr<PagedV4Model> cpu_;
  std::unique_ptr<cuda_v4::CudaV4Model> gpu_;
  std::unique_ptr<KvPool> pool_;
};
TempDir* CudaV4ModelTest::tmp_ = nullptr;
std::map<Checkpoint, std::string>* CudaV4ModelTest::dirs_ = nullptr;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t slot;
  int64_t done = 0;
};

TEST_P(CudaV4ModelTest, BatchedChunksAndDecodeStepsMatchTheCpu) {
  // Long enough for every window kind: CSA's indexer picks 8 of up to 50 entries, HCA
  // closes windows of 16, the ring of 16 wraps many times.
  std::vector<Seq> seqs = {{Tokens(200, 1), {9, 2, 14, 20}, 2}, {Tokens(52, 2), {0}, 0}, {Tokens(130, 3), {5, 11, 7}, 1}};
  const std::vector<std::vector<std::pair<int64_t, bool>>> plan = {
      {{70, true}, {40, true}, {0, false}},  {{81, true}, {1, true}, {30, true}},
      {{1, true}, {1, true}, {61, true}},    {{3, true}, {10, true}, {10, true}},
      {{45, true}, {0, false}, {1, true}},
      // Passes of at most 8 rows (the FP8 GEMV's decode shapes).
      {{0, false}, {0, false}, {1, true}},   {{0, false}, {0, false}, {5, true}},
      {{0, false}, {0, false}, {8, true}},
  };
  int64_t rows = 0, same_top1 = 0;
  double worst = 0.0;
  for (size_t step = 0; step < plan.size(); ++step) {
    std::vector<ForwardSequence> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto [n, all] = plan[step][i];
      if (n == 0) continue;
      Seq& s = seqs[i];
      batch.push_back({.tokens = std::span(s.tokens).subspan(s.done, n), .start_position = s.done,
                       .block_table = s.blocks, .all_logits = all, .state_slot = s.slot});
      s.done += n;
    }
    absl::StatusOr<std::vector<float>> want = cpu_->Forward(batch, *pool_);
    ASSERT_TRUE(want.ok()) << want.status();
    int layers_seen = 0;
    absl::StatusOr<std::vector<float>> got = gpu_->Forward(batch, {.after_layer_kv = [&](int64_t) { ++layers_seen; }});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(layers_seen, cpu_->config().num_hidden_layers);
    ASSERT_EQ(got->size(), want->size()) << "step " << step;
    for (size_t r = 0; r * kVocab < want->size(); ++r) {
      const float* w = want->data() + r * kVocab;
      const float* g = got->data() + r * kVocab;
      double diff = 0.0, norm = 0.0;
      for (int64_t v = 0; v < kVocab; ++v) {
        diff += (static_cast<double>(g[v]) - w[v]) * (static_cast<double>(g[v]) - w[v]);
        norm += static_cast<double>(w[v]) * w[v];
      }
      worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
      same_top1 += Argmax(w) == Argmax(g);
      ++rows;
    }
  }
  std::printf("rows %lld, same top-1 %lld, worst relative L2 %.3g\n", static_cast<long long>(rows),
              static_cast<long long>(same_top1), worst);
  EXPECT_GE(same_top1 * 1000, rows * 995);
  EXPECT_LT(worst, 1e-5);

  // The state the GPU keeps is the CPU's: every float of the pool (zeroed alike at the
  // start; stale rows are never written by either).
  absl::StatusOr<std::unique_ptr<KvPool>> copy = KvPool::Create(cpu_->kv_streams(), pool_->geometry());
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(gpu_->CopyPoolTo(**copy).ok());
  const float* a = reinterpret_cast<const float*>(pool_->memory().data());
  const float* b = reinterpret_cast<const float*>((*copy)->memory().data());
  const size_t n = pool_->memory().size() / sizeof(float);
  size_t bad = 0, first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-4f * (1.0f + std::fabs(a[i])))) {
      if (bad++ == 0) first_bad = i;
    }
  }
  EXPECT_EQ(bad, 0u) << "first at float " << first_bad << " of " << n << ": cpu " << a[first_bad] << ", gpu "
                     << b[first_bad];
}

TEST_P(CudaV4ModelTest, GreedyContinuationsMatchTheCpu) {
  constexpr int kPrompts = 10, kSteps = 24;
  std::vector<Seq> seqs;
  for (int i = 0; i < kPrompts; ++i) {
    seqs.push_back({Tokens(20 + 7 * i, 100 + i), {static_cast<int32_t>(2 * i), static_cast<int32_t>(2 * i + 1)}, i});
  }
  auto run = [&](bool gpu) {
    std::vector<std::vector<int32_t>> out(kPrompts);
    std::vector<std::vector<int32_t>> tokens;
    for (const Seq& s : seqs) tokens.push_back(s.tokens);
    std::vector<int64_t> done(kPrompts, 0);
    for (int step = 0; step <= kSteps; ++step) {
      std::vector<ForwardSequence> batch;
      for (int i = 0; i < kPrompts; ++i) {
        const int64_t n = static_cast<int64_t>(tokens[i].size()) - done[i];
        batch.push_back({.tokens = std::span(tokens[i]).subspan(done[i], n), .start_position = done[i],
                         .block_table = seqs[i].blocks, .state_slot = seqs[i].slot});
        done[i] += n;
      }
      absl::StatusOr<std::vector<float>> logits = gpu ? gpu_->Forward(batch) : cpu_->Forward(batch, *pool_);
      EXPECT_TRUE(logits.ok()) << logits.status();
      if (!logits.ok()) return out;
      for (int i = 0; i < kPrompts; ++i) {
        const int32_t next = static_cast<int32_t>(Argmax(logits->data() + i * kVocab));
        out[i].push_back(next);
        tokens[i].push_back(next);
      }
    }
    return out;
  };
  const std::vector<std::vector<int32_t>> want = run(false), got = run(true);
  int same = 0;
  for (int i = 0; i < kPrompts; ++i) same += want[i] == got[i];
  std::printf("greedy continuations identical: %d of %d\n", same, kPrompts);
  EXPECT_EQ(same, kPrompts);
}

// A decode pass replayed from a captured graph runs the eager pass's kernels in the same
// order on the same data (the shared expert on a second branch beside the routed experts,
// the eager model's after them): its logits are the eager model's bit for bit, across steps that
// close compressor windows (new launch layouts) and steps that replay. Passes with a host
// round trip (float32 experts) never replay.
TEST_P(CudaV4ModelTest, GraphReplaysEqualEagerPasses) {
  // The eager model also runs its shared experts after the routed ones, on one stream: the
  // graphs' second branch changes no bit either.
  absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> eager =
      cuda_v4::CudaV4Model::Load(dirs_->at(GetParam()), {.cuda_graphs = false, .shared_expert_beside = false});
  ASSERT_TRUE(eager.ok()) << eager.status();
  ASSERT_TRUE((*eager)->EnsurePool(pool_->geometry()).ok());
  std::vector<int32_t> tokens = Tokens(30, 77);
  const std::vector<int32_t> blocks = {4, 6};
  int64_t done = 0;
  for (int step = 0; step < 41; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size()) - done;
    const ForwardSequence s{.tokens = std::span(tokens).subspan(done, n), .start_position = done,
                            .block_table = blocks, .state_slot = 3};
    absl::StatusOr<std::vector<float>> want = (*eager)->Forward({&s, 1});
    absl::StatusOr<std::vector<float>> got = gpu_->Forward({&s, 1});
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, *want) << "step " << step;
    done += n;
    tokens.push_back(static_cast<int32_t>(Argmax(got->data())));
  }
  std::printf("passes replayed from graphs: %lld of 41\n", static_cast<long long>(gpu_->graph_replays()));
  if (GetParam() == Checkpoint::kF32) {
    EXPECT_EQ(gpu_->graph_replays(), 0);
  } else {
    // Every pass but each launch layout's first: the 30-token prompt (a layout of its own),
    // and the decode steps' three (no window closing, a CSA window closing, CSA and HCA
    // windows closing; entry counts stay inside their first bucket), so 41 - 4.
    EXPECT_EQ(gpu_->graph_replays(), 37);
  }
  EXPECT_EQ((*eager)->graph_replays(), 0);
  EXPECT_EQ((*eager)->shared_expert_branches(), 0);
  if (GetParam() == Checkpoint::kFp8WholeBlocks) {
    // Enqueued (a replay reuses its graph's branch): every layer (each an MoE layer) of
    // each decode layout's eager first pass and of its capture, 3 layouts; not the
    // prompt's (30 rows x top-k: its experts' rows go through the host).
    EXPECT_EQ(gpu_->shared_expert_branches(), 2 * 3 * cpu_->config().num_hidden_layers)
        << "the shared expert should run beside the routed experts";
  }
}

double RelativeL2(const float* got, const float* want) {
  double diff = 0.0, norm = 0.0;
  for (int64_t v = 0; v < kVocab; ++v) {
    diff += (static_cast<double>(got[v]) - want[v]) * (static_cast<double>(got[v]) - want[v]);
    norm += static_cast<double>(want[v]) * want[v];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Options::fp8_gemm: a prompt's pass of >= 128 rows multiplies the FP8 matrices on the FP8
// tensor cores with e4m3 activations. A CPU engine given the same input rounding is the
// reference; the two still differ in the order and precision of the block sums, and with
// e4m3 inputs a small difference can move a value across a rounding boundary and grow
// through the layers, so no row-by-row bound holds. What must hold: the GPU is as far from
// the plain CPU as the rounded CPU is (its deviation is the rounding's, nothing more), and
// picks the plain CPU's top-1 as often, within 5 % of the rows.
TEST_P(CudaV4ModelTest, Fp8GemmPrefillMatchesTheCpuWithTheSameRounding) {
  if (GetParam() == Checkpoint::kF32) GTEST_SKIP() << "no FP8 matrices";
  if (!cuda::Fp8GemmSupported()) GTEST_SKIP() << "Fp8Gemm runs on sm_90 only";
  const std::string& dir = dirs_->at(GetParam());
  absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> fp8 = cuda_v4::CudaV4Model::Load(dir, {.fp8_gemm = true});
  absl::StatusOr<std::unique_ptr<PagedV4Model>> rounded =
      PagedV4Model::Load(dir, {.num_threads = 2, .fp8_activation_rounding = true});
  ASSERT_TRUE(fp8.ok() && rounded.ok()) << fp8.status() << " " << rounded.status();
  ASSERT_TRUE((*fp8)->EnsurePool(pool_->geometry()).ok());
  absl::StatusOr<std::unique_ptr<KvPool>> rounded_pool = KvPool::Create(cpu_->kv_streams(), pool_->geometry());
  ASSERT_TRUE(rounded_pool.ok());
  const std::vector<int32_t> prompt = Tokens(300, 11), blocks = {1, 2, 3, 4, 5};
  const ForwardSequence s{.tokens = prompt, .start_position = 0, .block_table = blocks, .all_logits = true,
                          .state_slot = 0};
  absl::StatusOr<std::vector<float>> plain = cpu_->Forward({&s, 1}, *pool_);
  absl::StatusOr<std::vector<float>> reference = (*rounded)->Forward({&s, 1}, **rounded_pool);
  absl::StatusOr<std::vector<float>> got = (*fp8)->Forward({&s, 1});
  ASSERT_TRUE(plain.ok() && reference.ok() && got.ok()) << plain.status() << " " << reference.status() << " "
                                                         << got.status();
  const int64_t gemms = (*fp8)->fp8_gemms();
  EXPECT_GE(gemms, (GetParam() == Checkpoint::kFp8WholeBlocks ? 7 : 1) * cpu_->config().num_hidden_layers);
  const int rows = static_cast<int>(prompt.size());
  int gpu_top1 = 0, rounded_top1 = 0;
  double gpu_mean = 0.0, rounded_mean = 0.0, between = 0.0;
  for (int r = 0; r < rows; ++r) {
    const float* p = &(*plain)[r * kVocab];
    const float* g = &(*got)[r * kVocab];
    const float* c = &(*reference)[r * kVocab];
    gpu_mean += RelativeL2(g, p) / rows;
    rounded_mean += RelativeL2(c, p) / rows;
    between += RelativeL2(g, c) / rows;
    gpu_top1 += Argmax(g) == Argmax(p);
    rounded_top1 += Argmax(c) == Argmax(p);
  }
  std::printf("prefill of %d tokens, %lld FP8 GEMMs; against the plain CPU: GPU mean relative L2 %.3e, same top-1 %d; "
              "CPU with the GPU's rounding %.3e, %d; GPU against that CPU %.3e\n",
              rows, static_cast<long long>(gemms), gpu_mean, gpu_top1, rounded_mean, rounded_top1, between);
  EXPECT_GT(rounded_mean, 0.0) << "the rounding should change the CPU's logits";
  EXPECT_LE(gpu_mean, 1.5 * rounded_mean + 0.01);
  EXPECT_GE(gpu_top1, rounded_top1 - rows / 20);

  // Passes under 128 rows keep the float32 products.
  const std::vector<int32_t> short_prompt = Tokens(100, 12), short_blocks = {6, 7};
  const ForwardSequence short_s{.tokens = short_prompt, .start_position = 0, .block_table = short_blocks,
                                .state_slot = 1};
  ASSERT_TRUE((*fp8)->Forward({&short_s, 1}).ok());
  EXPECT_EQ((*fp8)->fp8_gemms(), gemms) << "a 100-row pass took the FP8 GEMMs";
}

TEST_P(CudaV4ModelTest, RefusesBadBatches) {
  const std::vector<int32_t> bad_token = {1, static_cast<int32_t>(kVocab)}, ok = {1, 2}, blocks = {3};
  auto status = [&](const ForwardSequence& s) {
    const std::vector<ForwardSequence> batch = {s};
    return gpu_->Forward(batch).status();
  };
  EXPECT_EQ(status({.tokens = bad_token, .block_table = blocks, .state_slot = 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status({.tokens = ok, .block_table = blocks, .state_slot = 99}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status({.tokens = ok, .block_table = {}, .state_slot = 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status({.tokens = ok, .block_table = blocks, .state_slot = 0, .mtp = true}).code(),
            absl::StatusCode::kUnimplemented);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, CudaV4ModelTest,
                         ::testing::Values(Checkpoint::kF32, Checkpoint::kFp8, Checkpoint::kFp8WholeBlocks),
                         [](const ::testing::TestParamInfo<Checkpoint>& info) {
                           return std::string(info.param == Checkpoint::kF32    ? "F32"
                                              : info.param == Checkpoint::kFp8 ? "Fp8"
                                                                               : "Fp8WholeBlocks");
                         });

}  // namespace
}  // namespace tandem::v4
