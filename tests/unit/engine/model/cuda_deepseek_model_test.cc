// CudaDeepseekModel against the CPU reference (DeepseekModel) on the built-in models:
// `tiny` (DeepSeek-V3 shape: q_lora, sigmoid noaux_tc routing, YaRN) and `tiny-v2`
// (DeepSeek-V2 shape: no q_lora, softmax group-limited greedy routing). Skips, saying
// why, where no GPU is usable.
//
// Tolerances (issue 8's acceptance): logits within 2e-2 of the CPU's, relative to the
// row's largest logit, and the same top-1 token, on >= 99% of 500 teacher-forced
// positions; greedy generation identical for 32+ tokens.
//
// What limits agreement: the GPU keeps the KV cache in bf16 and the attention kernels
// take bf16 queries, keys and probabilities (the CPU computes all of it in float32),
// which puts typical logit differences near 1e-3 of the largest logit. On these
// random-weight models the MoE routing is fragile: a token whose k-th and (k+1)-th
// experts score within ~1e-3 switches experts under such a perturbation (about 1 in 300
// token-layers with every rounding, 1 in 1000 with the KV cache's alone), and that
// token's logits then differ by 10-80%. A CPU emulation of exactly these roundings
// (everything else float32) reproduces it: 1-3 of 500 teacher-forced positions beyond
// 2e-2 (routing switches), 496-499 same top-1 (the GPU: 495-499), and free-running greedy
// continuations that part after 2-10 tokens on 2-4 of 10 `tiny` prompts (routing switches
// or top-2 logits within 2e-3). Hence the position criteria below are >= 99%, not all,
// and the greedy criterion counts prompts. The fixture's GPU model runs every GEMM with
// split (near-float32) activations so that only those roundings remain; DefaultOptions
// checks the production configuration (bf16 GEMM inputs for steps of more than 64 tokens).
#include "engine/model/cuda/cuda_deepseek_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>

#include "absl/strings/str_format.h"
#include "engine/model/deepseek_model.h"
#include "engine/model/model_resolver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/cuda_model_test_support.h"
#include "tests/unit/engine/model/routing_near_ties.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::Argmax;
using testing::HaveGpu;
using testing::MakeModel;
using testing::PresetJson;
using testing::RowError;
using testing::Table;
using testing::TempDir;
using testing::Tokens;

// Production defaults, but small buffers.
CudaDeepseekModel::LoadOptions DefaultOptions() {
  CudaDeepseekModel::LoadOptions o;
  o.max_batch_tokens = 1024;
  o.max_seqs = 32;
  o.max_context = 2048;
  o.kv_blocks = 256;
  return o;
}

// Every GEMM through the grouped kernel with split activations (see the header comment).
CudaDeepseekModel::LoadOptions GpuOptions() {
  CudaDeepseekModel::LoadOptions o = DefaultOptions();
  o.small_gemm_max_rows = 1024;
  o.moe_grouped_max_tokens = 1024;
  o.split_activations_max_tokens = 1024;
  return o;
}

class CudaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
    absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
    ASSERT_TRUE(dir.ok()) << dir.status();
    absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu = DeepseekModel::Load(*dir);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> gpu = CudaDeepseekModel::Load(*dir, GpuOptions());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    vocab_ = cpu_->config().vocab_size;
    std::printf("%s on %s: %s; %.1f MB of weights, %lld KV blocks\n", GetParam().c_str(), gpu_->device_name().c_str(),
                cpu_->config().Summary().c_str(), gpu_->weight_bytes() / 1e6,
                static_cast<long long>(gpu_->num_blocks()));
  }

  std::unique_ptr<DeepseekModel> cpu_;
  std::unique_ptr<CudaDeepseekModel> gpu_;
  int64_t vocab_ = 0;
};

TEST_P(CudaModelTest, TeacherForcedLogitsMatchCpu) {
  // 100 tokens of prefill (every position's logits), then 400 decode steps fed the
  // reference tokens: both attention forms, the decode graphs and the prefill path.
  const int kPrefill = 100, kTotal = 500;
  const std::vector<int32_t> tokens = Tokens(kTotal, vocab_, 1);
  const std::vector<int32_t> table = Table(3, (kTotal + 63) / 64);
  LatentKvCache cache = cpu_->MakeKvCache(16);
  std::vector<float> cpu_logits, gpu_logits;
  ForwardSequence prefill{.tokens = {tokens.data(), kPrefill}, .start_position = 0, .block_table = table,
                          .all_logits = true};
  absl::StatusOr<std::vector<float>> c = cpu_->Forward({&prefill, 1}, cache);
  absl::StatusOr<std::vector<float>> g = gpu_->Forward({&prefill, 1});
  ASSERT_TRUE(c.ok() && g.ok()) << c.status() << " " << g.status();
  cpu_logits = *c;
  gpu_logits = *g;
  for (int p = kPrefill; p < kTotal; ++p) {
    ForwardSequence step{.tokens = {tokens.data() + p, 1}, .start_position = p, .block_table = table};
    c = cpu_->Forward({&step, 1}, cache);
    g = gpu_->Forward({&step, 1});
    ASSERT_TRUE(c.ok() && g.ok()) << c.status() << " " << g.status();
    cpu_logits.insert(cpu_logits.end(), c->begin(), c->end());
    gpu_logits.insert(gpu_logits.end(), g->begin(), g->end());
  }
  ASSERT_EQ(gpu_logits.size(), static_cast<size_t>(kTotal * vocab_));
  int same_top1 = 0, within = 0;
  std::vector<double> errors;
  for (int p = 0; p < kTotal; ++p) {
    const float* gr = &gpu_logits[p * vocab_];
    const float* cr = &cpu_logits[p * vocab_];
    errors.push_back(RowError(gr, cr, vocab_));
    within += errors.back() <= 2e-2;
    same_top1 += Argmax(gr, vocab_) == Argmax(cr, vocab_);
  }
  std::sort(errors.begin(), errors.end());
  std::printf("teacher forcing, %d positions: relative error p50 %.2e p90 %.2e p99 %.2e max %.2e; within 2e-2: %d; "
              "same top-1: %d\n",
              kTotal, errors[kTotal / 2], errors[kTotal * 9 / 10], errors[kTotal * 99 / 100], errors.back(), within,
              same_top1);
  EXPECT_LE(errors[kTotal / 2], 5e-3);
  EXPECT_GE(within, kTotal * 99 / 100);
  EXPECT_GE(same_top1, kTotal * 99 / 100);
}

// Greedy continuations of 10 prompts of different lengths, prefilled in one batch and then
// decoded together, on the GPU and on `cpu`; returns how many prompts agree for 32+ tokens.
int MatchingGreedyPrompts(DeepseekModel& cpu, CudaDeepseekModel& gpu, int64_t vocab) {
  constexpr int kPrompts = 10, kSteps = 40;
  std::vector<std::vector<int32_t>> prompts, tables, cpu_out(kPrompts), gpu_out(kPrompts);
  for (int i = 0; i < kPrompts; ++i) {
    prompts.push_back(Tokens(5 + 7 * i, vocab, 10 + i));
    tables.push_back(Table(i * 4, 4));
  }
  LatentKvCache cache = cpu.MakeKvCache(4 * kPrompts);
  std::vector<ForwardSequence> batch(kPrompts);
  for (int i = 0; i < kPrompts; ++i) batch[i] = {.tokens = prompts[i], .start_position = 0, .block_table = tables[i]};
  absl::StatusOr<std::vector<float>> c = cpu.Forward(batch, cache);
  absl::StatusOr<std::vector<int32_t>> g = gpu.ForwardGreedy(batch);
  EXPECT_TRUE(c.ok() && g.ok()) << c.status() << " " << g.status();
  if (!c.ok() || !g.ok()) return 0;
  std::vector<int32_t> next_cpu(kPrompts), next_gpu(kPrompts);
  for (int step = 0; step < kSteps; ++step) {
    for (int i = 0; i < kPrompts; ++i) {
      next_cpu[i] = Argmax(&(*c)[i * vocab], vocab);
      next_gpu[i] = (*g)[i];
      cpu_out[i].push_back(next_cpu[i]);
      gpu_out[i].push_back(next_gpu[i]);
    }
    std::vector<ForwardSequence> cpu_batch(kPrompts), gpu_batch(kPrompts);
    for (int i = 0; i < kPrompts; ++i) {
      const int64_t pos = static_cast<int64_t>(prompts[i].size()) + step;
      cpu_batch[i] = {.tokens = {&next_cpu[i], 1}, .start_position = pos, .block_table = tables[i]};
      gpu_batch[i] = {.tokens = {&next_gpu[i], 1}, .start_position = pos, .block_table = tables[i]};
    }
    c = cpu.Forward(cpu_batch, cache);
    g = gpu.ForwardGreedy(gpu_batch);
    EXPECT_TRUE(c.ok() && g.ok()) << c.status() << " " << g.status();
    if (!c.ok() || !g.ok()) return 0;
  }
  int matching = 0;
  for (int i = 0; i < kPrompts; ++i) {
    int same = 0;
    while (same < kSteps && cpu_out[i][same] == gpu_out[i][same]) ++same;
    std::printf("prompt %d (%zu tokens): %d of %d greedy tokens identical\n", i, prompts[i].size(), same, kSteps);
    matching += same >= 32;
  }
  return matching;
}

TEST_P(CudaModelTest, BatchedGreedyGenerationMatchesCpu) {
  const int matching = MatchingGreedyPrompts(*cpu_, *gpu_, vocab_);
  std::printf("CPU with a float32 KV cache: %d of 10 prompts: 32+ identical greedy tokens\n", matching);
  // The GPU keeps its cache in bf16: against a float32 cache the rounding alone parts some
  // continuations (tiny 8 of 10, tiny-v2 10 of 10 on the H200); the exact-precision
  // comparison is the next test's.
  EXPECT_GE(matching, 7);
}

// The same against the CPU at the GPU's KV cache precision (entries rounded to bf16).
TEST_P(CudaModelTest, BatchedGreedyGenerationMatchesCpuWithBf16KvCache) {
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu = DeepseekModel::Load(*dir, {.bf16_kv_cache = true});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int matching = MatchingGreedyPrompts(**cpu, *gpu_, vocab_);
  std::printf("CPU with a bf16 KV cache: %d of 10 prompts: 32+ identical greedy tokens\n", matching);
  EXPECT_EQ(matching, 10);
}

// Layer by layer, the KV cache entries the GPU writes against the CPU's at the same
// precision (bf16_kv_cache: both hold bf16 values), after a 60-token prefill and after 40
// teacher-forced decode steps: the share of entries that differ (by at least one bf16 step).
// Layer 0's inputs are the same on both sides, so its entries may differ only where the
// float32 value before rounding sits within float error of a rounding boundary (a fraction
// of a percent): a larger share means the projection, norm, rotary or cache write part
// from the CPU. Later layers inherit every difference of the layers before them (the bf16
// queries and probabilities of the attention above all, docs/performance.md); printed.
TEST_P(CudaModelTest, KvEntriesPerLayerMatchCpuAtBf16) {
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu = DeepseekModel::Load(*dir, {.bf16_kv_cache = true});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int kPrefill = 60, kTotal = 100;
  const std::vector<int32_t> tokens = Tokens(kTotal, vocab_, 1);
  const std::vector<int32_t> table = Table(3, 2);
  LatentKvCache cache = (*cpu)->MakeKvCache(8);
  const int64_t layers = (*cpu)->config().num_hidden_layers, dim = (*cpu)->config().kv_entry_dim();
  // The share of differing entries of positions [first, first + n), per layer.
  auto differing = [&](int64_t first, int64_t n) {
    std::vector<double> share;
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<float> g(static_cast<size_t>(n * dim));
      EXPECT_TRUE(gpu_->ReadKvEntries(l, table, first, n, g.data()).ok());
      int64_t differ = 0;
      for (int64_t p = 0; p < n; ++p) {
        const float* c = cache.Entry(l, table, first + p);
        for (int64_t i = 0; i < dim; ++i) differ += g[p * dim + i] != c[i];
      }
      share.push_back(static_cast<double>(differ) / static_cast<double>(n * dim));
    }
    return share;
  };
  ForwardSequence prefill{.tokens = {tokens.data(), kPrefill}, .start_position = 0, .block_table = table};
  ASSERT_TRUE((*cpu)->Forward({&prefill, 1}, cache).ok());
  ASSERT_TRUE(gpu_->Forward({&prefill, 1}).ok());
  const std::vector<double> after_prefill = differing(0, kPrefill);
  for (int p = kPrefill; p < kTotal; ++p) {
    ForwardSequence step{.tokens = {tokens.data() + p, 1}, .start_position = p, .block_table = table};
    ASSERT_TRUE((*cpu)->Forward({&step, 1}, cache).ok());
    ASSERT_TRUE(gpu_->Forward({&step, 1}).ok());
  }
  const std::vector<double> after_decode = differing(kPrefill, kTotal - kPrefill);
  for (int64_t l = 0; l < layers; ++l) {
    std::printf("layer %lld: %.2f%% of the prefill's KV entries differ from the CPU's, %.2f%% of the decode steps'\n",
                static_cast<long long>(l), 100 * after_prefill[l], 100 * after_decode[l]);
  }
  EXPECT_LE(after_prefill[0], 0.01);
  EXPECT_LE(after_decode[0], 0.01);
}

TEST_P(CudaModelTest, MixedBatchesAndForcedFormsMatchCpu) {
  // A cached prefix then a chunk after it, a decode token and a no-logits chunk in one
  // pass; then the same prompt with each attention form forced.
  const std::vector<int32_t> a = Tokens(130, vocab_, 21), b = Tokens(40, vocab_, 22), c = Tokens(70, vocab_, 23);
  const std::vector<int32_t> ta = Table(0, 3), tb = Table(3, 1), tc = Table(4, 2);
  LatentKvCache cache = cpu_->MakeKvCache(8);
  std::vector<ForwardSequence> first = {{.tokens = {a.data(), 60}, .start_position = 0, .block_table = ta},
                                        {.tokens = {b.data(), 39}, .start_position = 0, .block_table = tb}};
  ASSERT_TRUE(cpu_->Forward(first, cache).ok());
  ASSERT_TRUE(gpu_->Forward(first).ok());
  std::vector<ForwardSequence> second = {
      {.tokens = {a.data() + 60, 70}, .start_position = 60, .block_table = ta, .all_logits = true},
      {.tokens = {b.data() + 39, 1}, .start_position = 39, .block_table = tb},
      {.tokens = {c.data(), 70}, .start_position = 0, .block_table = tc, .no_logits = true},
  };
  absl::StatusOr<std::vector<float>> cl = cpu_->Forward(second, cache);
  absl::StatusOr<std::vector<float>> gl = gpu_->Forward(second);
  ASSERT_TRUE(cl.ok() && gl.ok()) << cl.status() << " " << gl.status();
  ASSERT_EQ(gl->size(), static_cast<size_t>(71 * vocab_));
  auto within = [&](const std::vector<float>& g, const std::vector<float>& c, int rows, double tol) {
    int n = 0;
    for (int r = 0; r < rows; ++r) n += RowError(&g[r * vocab_], &c[r * vocab_], vocab_) <= tol;
    return n;
  };
  EXPECT_GE(within(*gl, *cl, 71, 2e-2), 69);

  for (AttentionForm form : {AttentionForm::kExpanded, AttentionForm::kAbsorbed}) {
    LatentKvCache fresh = cpu_->MakeKvCache(8);
    const std::vector<int32_t> t = Table(0, 3);
    ForwardSequence s{.tokens = a, .start_position = 0, .block_table = t, .all_logits = true};
    cl = cpu_->Forward({&s, 1}, fresh, {.attention = form});
    gl = gpu_->Forward({&s, 1}, {.attention = form});
    ASSERT_TRUE(cl.ok() && gl.ok()) << cl.status() << " " << gl.status();
    EXPECT_GE(within(*gl, *cl, 130, 2e-2), 127) << (form == AttentionForm::kExpanded ? "expanded" : "absorbed");
  }

  // The production configuration (bf16 GEMM inputs for these >64-token steps, cuBLAS,
  // MoE per expert): a looser bound, still far below what a wrong kernel gives.
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> fast = CudaDeepseekModel::Load(*dir, DefaultOptions());
  ASSERT_TRUE(fast.ok()) << fast.status();
  LatentKvCache fresh = cpu_->MakeKvCache(8);
  const std::vector<int32_t> t = Table(0, 3);
  ForwardSequence s{.tokens = a, .start_position = 0, .block_table = t, .all_logits = true};
  cl = cpu_->Forward({&s, 1}, fresh);
  gl = (*fast)->Forward({&s, 1});
  ASSERT_TRUE(cl.ok() && gl.ok());
  const int close = within(*gl, *cl, 130, 2e-2);
  std::printf("default options, 130-token prefill: %d of 130 rows within 2e-2\n", close);
  EXPECT_GE(close, 120);

  // The same with the MoE through cuBLAS, one GEMM per expert spread over the side streams
  // (what prefill chunks above moe_grouped_max_tokens take).
  CudaDeepseekModel::LoadOptions per_expert_options = DefaultOptions();
  per_expert_options.moe_grouped_max_tokens = 64;
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> per_expert = CudaDeepseekModel::Load(*dir, per_expert_options);
  ASSERT_TRUE(per_expert.ok()) << per_expert.status();
  gl = (*per_expert)->Forward({&s, 1});
  ASSERT_TRUE(gl.ok()) << gl.status();
  const int close_per_expert = within(*gl, *cl, 130, 2e-2);
  std::printf("experts by cuBLAS on side streams, 130-token prefill: %d of 130 rows within 2e-2\n", close_per_expert);
  EXPECT_GE(close_per_expert, 120);
}

TEST_P(CudaModelTest, KvExportAndImport) {
  // Export: the GPU cache after a prefill holds the model's entries: every one of layer 0
  // (same inputs on both sides) within 2e-2 of the CPU's at the same precision, 99 % of
  // the later layers' (there a perturbation as small as rounding the CPU's own cache to
  // bf16 moves isolated entries of tiny-v2's layer 2 by 12 %: a near-tie in some token's
  // expert choice), and both export paths the same bits.
  const std::vector<int32_t> p = Tokens(100, vocab_, 31);
  const std::vector<int32_t> t = Table(10, 2);
  LatentKvCache cache = cpu_->MakeKvCache(16);
  ForwardSequence s{.tokens = p, .start_position = 0, .block_table = t};
  ASSERT_TRUE(cpu_->Forward({&s, 1}, cache).ok());
  ASSERT_TRUE(gpu_->Forward({&s, 1}).ok());
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu_bf16 = DeepseekModel::Load(*dir, {.bf16_kv_cache = true});
  ASSERT_TRUE(cpu_bf16.ok()) << cpu_bf16.status();
  LatentKvCache cache_bf16 = (*cpu_bf16)->MakeKvCache(16);
  ASSERT_TRUE((*cpu_bf16)->Forward({&s, 1}, cache_bf16).ok());
  const int64_t entry = cpu_->config().kv_entry_dim(), layers = cpu_->config().num_hidden_layers;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<float> got(static_cast<size_t>(100 * entry)), blocks(static_cast<size_t>(128 * entry));
    ASSERT_TRUE(gpu_->ReadKvEntries(l, t, 0, 100, got.data()).ok());
    ASSERT_TRUE(gpu_->ReadKvBlocks(l, t, blocks.data()).ok());
    int64_t close = 0;
    double worst = 0;
    for (int64_t pos = 0; pos < 100; ++pos) {
      const float* want = cache_bf16.Entry(l, t, pos);
      for (int64_t d = 0; d < entry; ++d) {
        const double err = std::fabs(got[pos * entry + d] - want[d]) / (1.0 + std::fabs(want[d]));
        worst = std::max(worst, err);
        close += err <= 2e-2;
        ASSERT_EQ(blocks[pos * entry + d], got[pos * entry + d]) << l << " " << pos << " " << d;
      }
    }
    std::printf("layer %lld: %lld of %lld exported KV values within 2e-2 of the CPU's, worst %.2e\n",
                static_cast<long long>(l), static_cast<long long>(close), static_cast<long long>(100 * entry), worst);
    EXPECT_GE(close, l == 0 ? 100 * entry : 100 * entry * 99 / 100) << "layer " << l;
  }
  // Import: the CPU's entries written into other GPU blocks, then one decode step there.
  const std::vector<int32_t> t2 = Table(20, 2);
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<float> entries(static_cast<size_t>(100 * entry));
    for (int64_t pos = 0; pos < 100; ++pos) {
      std::copy(cache.Entry(l, t, pos), cache.Entry(l, t, pos) + entry, &entries[pos * entry]);
    }
    ASSERT_TRUE(gpu_->WriteKvEntries(l, t2, 0, entries.data(), 100).ok());
  }
  const int32_t next = p[5];
  ForwardSequence cpu_step{.tokens = {&next, 1}, .start_position = 100, .block_table = t};
  ForwardSequence gpu_step{.tokens = {&next, 1}, .start_position = 100, .block_table = t2};
  absl::StatusOr<std::vector<float>> cl = cpu_->Forward({&cpu_step, 1}, cache);
  absl::StatusOr<std::vector<float>> gl = gpu_->Forward({&gpu_step, 1});
  ASSERT_TRUE(cl.ok() && gl.ok());
  EXPECT_LE(RowError(gl->data(), cl->data(), vocab_), 2e-2);
}

TEST_P(CudaModelTest, RejectsBadInput) {
  const std::vector<int32_t> bad = {static_cast<int32_t>(vocab_)};
  const std::vector<int32_t> t = Table(0, 1);
  ForwardSequence s{.tokens = bad, .start_position = 0, .block_table = t};
  EXPECT_EQ(gpu_->Forward({&s, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> many = Tokens(2000, vocab_, 1);
  const std::vector<int32_t> t32 = Table(0, 32);
  ForwardSequence big{.tokens = many, .start_position = 0, .block_table = t32};
  EXPECT_EQ(gpu_->Forward({&big, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> far = {5};
  const std::vector<int32_t> out_of_range = {100000};
  ForwardSequence bad_block{.tokens = far, .start_position = 0, .block_table = out_of_range};
  EXPECT_EQ(gpu_->Forward({&bad_block, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CudaModelTest, SmallBatchDecodeMatchesCpu) {
  // Decode steps of 1 to 4 sequences take the fused kernels (GEMVs with the norms fused,
  // MLA prepare with W_UK, the split combine with W_UV, the one-launch MoE front end),
  // chained by programmatic dependent launch and replayed from graphs, the expert GEMVs;
  // the same steps with those off (or only the expert GEMVs off) give the same logits up to
  // float32 summation order.
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok());
  CudaDeepseekModel::LoadOptions plain_options = GpuOptions();
  plain_options.fused_decode_max_tokens = 0;
  plain_options.programmatic_launch = false;
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> plain = CudaDeepseekModel::Load(*dir, plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // The fused path with the grouped GEMM for the experts instead of the expert GEMVs.
  CudaDeepseekModel::LoadOptions grouped_options = GpuOptions();
  grouped_options.moe_expert_gemv = false;
  absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> grouped = CudaDeepseekModel::Load(*dir, grouped_options);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  for (int seqs : {1, 3, 4}) {
    std::vector<std::vector<int32_t>> tokens, tables;
    for (int i = 0; i < seqs; ++i) {
      tokens.push_back(Tokens(60 + 30, vocab_, 50 + i));
      tables.push_back(Table(40 + 2 * i, 2));
    }
    LatentKvCache cache = cpu_->MakeKvCache(64);
    std::vector<ForwardSequence> prefill(seqs);
    for (int i = 0; i < seqs; ++i) {
      prefill[i] = {.tokens = {tokens[i].data(), static_cast<size_t>(17 + 9 * i)}, .start_position = 0,
                    .block_table = tables[i]};
    }
    ASSERT_TRUE(cpu_->Forward(prefill, cache).ok());
    ASSERT_TRUE(gpu_->Forward(prefill).ok());
    ASSERT_TRUE((*plain)->Forward(prefill).ok());
    ASSERT_TRUE((*grouped)->Forward(prefill).ok());
    int rows = 0, within_cpu = 0, same_top1 = 0, within_plain = 0, within_grouped = 0;
    for (int step = 0; step < 30; ++step) {
      std::vector<ForwardSequence> batch(seqs);
      for (int i = 0; i < seqs; ++i) {
        const int64_t pos = 17 + 9 * i + step;
        batch[i] = {.tokens = {&tokens[i][pos], 1}, .start_position = pos, .block_table = tables[i]};
      }
      absl::StatusOr<std::vector<float>> c = cpu_->Forward(batch, cache);
      absl::StatusOr<std::vector<float>> g = gpu_->Forward(batch);
      absl::StatusOr<std::vector<float>> p = (*plain)->Forward(batch);
      absl::StatusOr<std::vector<float>> q = (*grouped)->Forward(batch);
      ASSERT_TRUE(c.ok() && g.ok() && p.ok() && q.ok())
          << c.status() << " " << g.status() << " " << p.status() << " " << q.status();
      for (int i = 0; i < seqs; ++i) {
        const float* gr = &(*g)[i * vocab_];
        ++rows;
        within_cpu += RowError(gr, &(*c)[i * vocab_], vocab_) <= 2e-2;
        within_plain += RowError(gr, &(*p)[i * vocab_], vocab_) <= 2e-2;
        within_grouped += RowError(gr, &(*q)[i * vocab_], vocab_) <= 2e-2;
        same_top1 += Argmax(gr, vocab_) == Argmax(&(*c)[i * vocab_], vocab_);
      }
    }
    std::printf("%d sequences, %d decode rows: %d within 2e-2 of the CPU, %d of the unfused GPU path, %d of the "
                "grouped expert GEMM, %d same top-1\n",
                seqs, rows, within_cpu, within_plain, within_grouped, same_top1);
    EXPECT_GE(within_cpu, rows * 97 / 100);
    EXPECT_GE(within_plain, rows * 97 / 100);
    EXPECT_GE(within_grouped, rows * 97 / 100);
    EXPECT_GE(same_top1, rows * 97 / 100);
  }
}

// Where a KV entry is more than one bf16 step (the spacing of bf16 values at the entry's
// largest magnitude) from the CPU's: the first such (layer, position), layers first.
struct KvMismatch {
  int64_t layer = -1;
  int position = -1;
  double steps = 0;
};

double KvSteps(const float* cpu, const float* gpu, int64_t dim) {
  // A GEMM's rounding error scales with its inputs, not with each output: the step is
  // taken at the entry's largest magnitude (bf16 keeps 8 significant bits: values in
  // [2^k, 2^(k+1)) are 2^(k-7) apart).
  double mag = 1e-30;
  for (int64_t i = 0; i < dim; ++i) mag = std::max(mag, std::abs(static_cast<double>(cpu[i])));
  const double step = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(mag))) - 7);
  double worst = 0;
  for (int64_t i = 0; i < dim; ++i) worst = std::max(worst, std::abs(static_cast<double>(gpu[i]) - cpu[i]) / step);
  return worst;
}

KvMismatch FirstKvMismatch(LatentKvCache& cpu, const std::vector<std::vector<float>>& gpu,
                           std::span<const int32_t> table, int n, int64_t dim, double* worst) {
  for (int64_t l = 0; l < static_cast<int64_t>(gpu.size()); ++l) {
    for (int p = 0; p < n; ++p) {
      const double steps = KvSteps(cpu.Entry(l, table, p), &gpu[l][p * dim], dim);
      if (steps > 1.0) return {.layer = l, .position = p, .steps = steps};
      *worst = std::max(*worst, steps);
    }
  }
  return {};
}

// Prefills longer than the split-activation bound (64 tokens) in one forward pass: the
// attention is expanded over bf16 queries, keys, values and probabilities, roundings the
// reference lacks. Every value of every layer's KV entries then lies within one bf16 step
// of the bf16-KV CPU's (a rounding that lands on a neighbouring value), up to routing
// near-ties: a token whose experts score within one bf16 step of the logits' scale of
// each other may be routed the other way by those roundings (tiny-v2, 336 tokens:
// position 332's experts 2 and 3 at layer 1 are 0.0015 apart in logits, and the GPU's
// expanded attention moves them by 0.004), after which its hidden state differs by whole
// units. Such a tie is resolved the GPU's way only where the CPU, run again with that one
// token's routing changed to a near-tied alternative, then agrees within one step at
// that position; every other position is still held to one step, and a mismatch no
// near-tie explains (a position, block or rope mistake of the full-step path) fails.
TEST_P(CudaModelTest, FullStepPrefillKvIsWithinOneBf16StepOfTheCpu) {
  absl::StatusOr<std::string> dir = ResolveModelDir(GetParam());
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<DeepseekModel>> cpu = DeepseekModel::Load(*dir, {.bf16_kv_cache = true});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t layers = (*cpu)->config().num_hidden_layers, dim = (*cpu)->config().kv_entry_dim();
  for (const int n : {77, 150, 256, 257, 300, 336, 512}) {
    const std::vector<int32_t> tokens = Tokens(n, vocab_, 2);
    const std::vector<int32_t> table = Table(8, 8);
    ForwardSequence prefill{.tokens = {tokens.data(), static_cast<size_t>(n)}, .start_position = 0, .block_table = table};
    ASSERT_TRUE(gpu_->Forward({&prefill, 1}).ok());
    std::vector<std::vector<float>> gpu_kv(static_cast<size_t>(layers), std::vector<float>(n * dim));
    for (int64_t l = 0; l < layers; ++l) ASSERT_TRUE(gpu_->ReadKvEntries(l, table, 0, n, gpu_kv[l].data()).ok());
    testing::RoutingOverrides resolved;  // near-ties the GPU resolved the other way
    std::string resolved_text;
    for (;;) {
      LatentKvCache cache = (*cpu)->MakeKvCache(16);
      testing::RecordedRoutings routing;
      ASSERT_TRUE((*cpu)->Forward({&prefill, 1}, cache, testing::RoutingHooks(&resolved, &routing)).ok());
      double worst = 0;
      const KvMismatch bad = FirstKvMismatch(cache, gpu_kv, table, n, dim, &worst);
      if (bad.layer < 0) {
        std::printf("%d tokens in one pass: every KV entry within %.2f bf16 steps of the CPU's, %zu routing "
                    "near-ties resolved the GPU's way%s\n",
                    n, worst, resolved.size(), resolved_text.c_str());
        break;
      }
      // Only the routing of the layer below can move this entry and none before it.
      const int64_t route_layer = bad.layer - 1;
      const auto recorded = routing.find(route_layer);
      ASSERT_TRUE(route_layer >= 0 && recorded != routing.end() && resolved.size() < 8)
          << n << " tokens: layer " << bad.layer << " position " << bad.position << " is " << bad.steps
          << " bf16 steps from the CPU's, and no routing near-tie can explain it";
      bool explained = false;
      for (const testing::RoutingChoice& alt : testing::NearTieAlternatives(recorded->second, bad.position)) {
        testing::RoutingOverrides trial = resolved;
        trial[{route_layer, bad.position}] = alt;
        LatentKvCache again = (*cpu)->MakeKvCache(16);
        ASSERT_TRUE((*cpu)->Forward({&prefill, 1}, again, testing::RoutingHooks(&trial, nullptr)).ok());
        if (KvSteps(again.Entry(bad.layer, table, bad.position), &gpu_kv[bad.layer][bad.position * dim], dim) <= 1.0) {
          resolved = std::move(trial);
          resolved_text += absl::StrFormat(" (layer %lld, position %d: %.1f steps before)",
                                           static_cast<long long>(route_layer), bad.position, bad.steps);
          explained = true;
          break;
        }
      }
      ASSERT_TRUE(explained) << n << " tokens: layer " << bad.layer << " position " << bad.position << " is "
                             << bad.steps << " bf16 steps from the CPU's, and no near-tie of its routing at layer "
                             << route_layer << " explains it";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaModelTest, ::testing::Values("tiny", "tiny-v2"));

TEST(CudaModelFormatsTest, GeneratedWeightsEqualTheCheckpoint) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  nlohmann::json j = nlohmann::json::parse(PresetJson("tiny"));
  j["vocab_size"] = 512;
  TempDir tmp;
  const std::string dir = MakeModel(tmp, "tiny", j.dump(), /*seed=*/7);
  auto loaded = CudaDeepseekModel::Load(dir, GpuOptions());
  auto generated = CudaDeepseekModel::CreateGenerated(j.dump(), 7, GpuOptions());
  ASSERT_TRUE(loaded.ok() && generated.ok()) << loaded.status() << " " << generated.status();
  EXPECT_EQ((*loaded)->weight_bytes(), (*generated)->weight_bytes());
  const std::vector<int32_t> p = Tokens(20, 512, 3), t = Table(0, 1);
  ForwardSequence s{.tokens = p, .start_position = 0, .block_table = t, .all_logits = true};
  absl::StatusOr<std::vector<float>> a = (*loaded)->Forward({&s, 1});
  absl::StatusOr<std::vector<float>> b = (*generated)->Forward({&s, 1});
  ASSERT_TRUE(a.ok() && b.ok());
  // Same weights (other weights differ at O(1)); only fp32 atomics may order sums
  // differently between the two runs.
  for (size_t i = 0; i < a->size(); i += 512) EXPECT_LE(RowError(&(*b)[i], &(*a)[i], 512), 1e-3) << i / 512;
}

TEST(CudaModelFormatsTest, Fp8CheckpointMatchesCpu) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  nlohmann::json j = nlohmann::json::parse(PresetJson("tiny"));
  j["vocab_size"] = 512;
  j["hidden_size"] = 256;
  j["intermediate_size"] = 384;
  TempDir tmp;
  const std::string dir = MakeModel(tmp, "fp8", j.dump(), 5, DType::kF8E4M3);
  auto cpu = DeepseekModel::Load(dir);
  auto gpu = CudaDeepseekModel::Load(dir, GpuOptions());
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << " " << gpu.status();
  const std::vector<int32_t> p = Tokens(40, 512, 4), t = Table(0, 1);
  LatentKvCache cache = (*cpu)->MakeKvCache(1);
  ForwardSequence s{.tokens = p, .start_position = 0, .block_table = t, .all_logits = true};
  absl::StatusOr<std::vector<float>> c = (*cpu)->Forward({&s, 1}, cache);
  absl::StatusOr<std::vector<float>> g = (*gpu)->Forward({&s, 1});
  ASSERT_TRUE(c.ok() && g.ok());
  // The GPU rounds the dequantized weights to bf16 (the CPU multiplies in float32): a row
  // may switch experts (see the header comment).
  int close = 0;
  for (int r = 0; r < 40; ++r) close += RowError(&(*g)[r * 512], &(*c)[r * 512], 512) <= 2e-2;
  EXPECT_GE(close, 38);
}

}  // namespace
}  // namespace tandem
