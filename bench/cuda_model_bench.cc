// The CUDA forward pass of a DeepSeek model against references measured in the same run
// (docs/design.md §11): decode steps against the memory-bandwidth roofline, prefill against
// cuBLAS's bf16 GEMM rate, and the GPU's idle time between decode steps.
//
//   cuda_model_bench (--config FILE [--seed S] | --model DIR) [--context N] [--steps N]
//                    [--batches 1,64,256] [--prefill N] [--prefill-chunk N] [--profile] [--timeline]
//                    [--default-only] [--moe-grouped-max-tokens N]
//                    [--json FILE]
//
// --config builds the model of a config.json on the GPU with the random weights
// `tandem make-model --config FILE --seed S` would write (bit-identical, no checkpoint
// on disk); --model loads a checkpoint directory. --moe-grouped-max-tokens sets
// LoadOptions::moe_grouped_max_tokens (steps up to that many tokens take the grouped GEMM).
//
// References, measured first: a 2 GiB device-to-device copy (bytes read + written per
// second) and an 8192^3 bf16 GEMM through cuBLAS (FLOP/s), both on random data.
//
// Decode at batch B: B sequences with `context` tokens already cached take `steps` greedy
// steps (graph replay after the first two of a shape). Batch 1 also runs with programmatic
// dependent launch off, with the fused small-batch kernels off as well (the unfused path),
// without graphs, and with the expert down projection's residual sums in a fixed order
// (deterministic_moe_down), and with the shared experts' gate_up tiles after the routing
// (moe_shared_experts_early off), and with bf16 decode queries (split_decode_queries
// off); batches up to 64 also with the grouped expert GEMM instead of the
// expert GEMVs (moe_expert_gemv off: the same step where the fused kernels do not run);
// batches 1 and 64 also with GPU sampling (ForwardSample, temperature 0.7, top-p 0.9)
// instead of the argmax. Roofline time of a step = (weight bytes the step must read:
// embedding rows, every dense weight, the experts at least one token was routed to, the
// LM head; plus the KV bytes its attention reads, B x context x
// (kv_lora_rank + rope) x 2 bytes x layers) / copy bandwidth. Reported fraction = roofline
// time / measured step time (host wall time per step, results on the host included).
// Idle time: from CUDA events at each step's first and last GPU operation, the gaps
// between one step's end and the next one's beginning, over the step period.
//
// FP8 checkpoints (or an FP8 config, e.g. bench/configs/deepseek_v2_lite_fp8.json: the
// make-model values quantized on the GPU): batches up to 4 also run on the bf16 copies
// of the same weights right after the default row (LoadOptions::fp8_decode off; the ratio
// is the FP8 forms' speed-up, the roofline counts the bytes each form reads), and 5
// greedy continuations of 32 tokens on each are held to vLLM's closeness check
// (fp8_greedy_closeness).
//
// Prefill: one prompt of N tokens (logits of its last token), FLOPs counted from the
// config (projections, expanded attention with its causal half, MLPs or routed + shared
// experts, one LM-head row) over the wall time, against the cuBLAS rate. Then the same
// prompt in chunks of --prefill-chunk tokens (default 2048, a worker's default
// --max-batch-tokens; 0: off), one forward pass each, against the one pass.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "bench/cuda_check.h"
#include "bench/cuda_copy_rate.h"
#include "engine/model/cuda/cuda_deepseek_model.h"
#include "kernels/cuda/cublas_gemm.h"
#include "kernels/cuda/random_init.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// FLOP/s of an n^3 bf16 GEMM (fp32 accumulation, bf16 out) through cuBLAS, random data,
// median of 10 after 3 warm-ups.
double CublasRate(int64_t n) {
  cuda::CublasGemm gemm;
  if (gemm.Init() != CUBLAS_STATUS_SUCCESS) std::exit(1);
  __nv_bfloat16 *x, *w, *y;
  CHECK_CUDA(cudaMalloc(&x, n * n * 2));
  CHECK_CUDA(cudaMalloc(&w, n * n * 2));
  CHECK_CUDA(cudaMalloc(&y, n * n * 2));
  CHECK_CUDA(cuda::RandomInitFill({.key = 1, .n = n * n, .init = cuda::RandomInit::kEmbedding, .out_bf16 = x}, nullptr));
  CHECK_CUDA(cuda::RandomInitFill({.key = 2, .n = n * n, .fan_in = n, .out_bf16 = w}, nullptr));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<double> rates;
  for (int i = 0; i < 13; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    if (gemm.Linear({.x = x, .ldx = n, .w = w, .ldw = n, .y = y, .ldy = n, .y_bf16 = true, .m = n, .n = n, .k = n},
                    nullptr) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cuBLAS GEMM failed\n");
      std::exit(1);
    }
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) rates.push_back(2.0 * n * n * n / (ms * 1e-3));
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  return Median(rates);
}

Json ProfileJson(const std::vector<std::pair<std::string, double>>& profile) {
  Json j = Json::object();
  for (const auto& [name, ms] : profile) j[name] = ms;
  return j;
}

struct DecodeResult {
  Json json;
  double step_ms = 0;
  double roofline_fraction = 0;
  double idle_fraction = 0;
};

struct DecodeVariant {
  const char* name = "default";
  bool graphs = true;
  bool programmatic_launch = true;
  int64_t fused_decode_max_tokens = 4;
  bool moe_expert_gemv = true;
  bool deterministic_moe_down = false;
  bool moe_shared_experts_early = true;
  bool split_decode_queries = true;
  bool sample = false;
  bool fp8_decode = true;  // FP8 checkpoints: the decode steps on the FP8 forms
  bool fp8_tensor_cores = true;
};

// vLLM's closeness check between an FP8 checkpoint's decode on its FP8 forms and on its
// bf16 copies: greedy continuations of `prompts` prompts, `tokens` tokens each, batch 1;
// where two part, each token must be within the other's top 5 at that position.
Json Fp8Closeness(CudaDeepseekModel& model, int prompts, int tokens) {
  const ModelConfig& c = model.config();
  const int64_t vocab = c.vocab_size;
  const auto argmax = [&](const float* row) {
    return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  };
  const auto in_top5 = [&](const float* row, int32_t t) {
    int above = 0;
    for (int64_t i = 0; i < vocab; ++i) above += row[i] > row[t];
    return above < 5;
  };
  int identical = 0, close = 0;
  Json parts = Json::array();
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> prompt(static_cast<size_t>(16 + p));
    for (size_t i = 0; i < prompt.size(); ++i) {
      prompt[i] = static_cast<int32_t>(3 + (i * 7919 + static_cast<size_t>(p) * 104729) % static_cast<size_t>(vocab - 3));
    }
    std::vector<int32_t> table((prompt.size() + tokens + 63) / 64);
    std::iota(table.begin(), table.end(), 0);
    std::vector<int32_t> out[2];
    std::vector<std::vector<float>> logits[2];
    for (int m = 0; m < 2; ++m) {
      model.set_fp8_decode(m == 0);
      ForwardSequence s{.tokens = prompt, .start_position = 0, .block_table = table};
      std::vector<float> l = OrDie(model.Forward({&s, 1}), "closeness prefill");
      for (int t = 0; t < tokens; ++t) {
        out[m].push_back(argmax(l.data()));
        logits[m].push_back(std::move(l));
        ForwardSequence d{.tokens = {&out[m].back(), 1},
                          .start_position = static_cast<int64_t>(prompt.size()) + t, .block_table = table};
        l = OrDie(model.Forward({&d, 1}), "closeness decode");
      }
    }
    model.set_fp8_decode(true);
    const auto part = std::mismatch(out[0].begin(), out[0].end(), out[1].begin());
    if (part.first == out[0].end()) {
      ++identical;
      ++close;
      continue;
    }
    const size_t at = static_cast<size_t>(part.first - out[0].begin());
    const bool ok = in_top5(logits[1][at].data(), out[0][at]) && in_top5(logits[0][at].data(), out[1][at]);
    close += ok;
    parts.push_back({{"prompt", p}, {"parts_at", at}, {"fp8_token", out[0][at]}, {"bf16_token", out[1][at]},
                     {"within_top5", ok}});
  }
  std::printf("FP8 forms vs bf16 copies, greedy %d tokens: %d of %d prompts identical, %d within the closeness check\n",
              tokens, identical, prompts, close);
  return {{"prompts", prompts}, {"tokens", tokens}, {"identical", identical}, {"within_closeness", close},
          {"partings", parts}, {"passed", close == prompts}};
}

DecodeResult Decode(CudaDeepseekModel& model, int batch, int context, int steps, const DecodeVariant& variant,
                    double copy_bw, bool profile, bool timeline = false) {
  const bool graphs = variant.graphs;
  const ModelConfig& c = model.config();
  const int warmup = 3;
  const int64_t blocks_per_seq = (context + warmup + steps + 2 + 63) / 64;
  std::vector<std::vector<int32_t>> tables(batch);
  for (int s = 0; s < batch; ++s) {
    tables[s].resize(blocks_per_seq);
    std::iota(tables[s].begin(), tables[s].end(), static_cast<int32_t>(s * blocks_per_seq));
  }
  std::vector<int32_t> tokens(batch);
  for (int s = 0; s < batch; ++s) tokens[s] = static_cast<int32_t>(3 + (s * 7919) % (c.vocab_size - 3));
  int64_t pos = context;  // the cache holds `context` entries per sequence (their values do not matter here)
  model.set_cuda_graphs(graphs);
  model.set_programmatic_launch(variant.programmatic_launch);
  model.set_fused_decode_max_tokens(variant.fused_decode_max_tokens);
  model.set_moe_expert_gemv(variant.moe_expert_gemv);
  model.set_deterministic_moe_down(variant.deterministic_moe_down);
  model.set_moe_shared_experts_early(variant.moe_shared_experts_early);
  model.set_split_decode_queries(variant.split_decode_queries);
  model.set_fp8_decode(variant.fp8_decode);
  model.set_fp8_tensor_cores(variant.fp8_tensor_cores);
  int64_t sample_step = 0;
  auto step = [&]() {
    std::vector<ForwardSequence> seqs(batch);
    for (int s = 0; s < batch; ++s) {
      seqs[s] = {.tokens = {&tokens[s], 1}, .start_position = pos, .block_table = tables[s]};
    }
    if (variant.sample) {
      std::vector<CudaDeepseekModel::SampleRow> rows(batch);
      for (int s = 0; s < batch; ++s) {
        rows[s] = {.temperature = 0.7f, .top_p = 0.9f, .seed = static_cast<uint64_t>(s), .step = sample_step};
      }
      tokens = OrDie(model.ForwardSample(seqs, rows), "decode step");
      ++sample_step;
    } else {
      tokens = OrDie(model.ForwardGreedy(seqs), "decode step");
    }
    ++pos;
  };
  for (int i = 0; i < warmup; ++i) step();
  model.set_step_events(true);
  std::vector<double> wall;
  const int64_t first_pos = pos;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    step();
    wall.push_back(Ms(t0, Clock::now()));
  }
  model.set_step_events(false);
  const std::vector<std::pair<double, double>> times = OrDie(model.TakeStepTimes(), "step events");
  const uint64_t weight_bytes = OrDie(model.LastForwardWeightBytes(), "weight bytes");
  std::vector<double> gpu, gaps, periods;
  for (size_t i = 0; i < times.size(); ++i) {
    gpu.push_back(times[i].second - times[i].first);
    if (i + 1 < times.size()) {
      gaps.push_back(times[i + 1].first - times[i].second);
      periods.push_back(times[i + 1].first - times[i].first);
    }
  }
  // KV the attention reads per step, at the mean cache length of the timed steps.
  const double mean_len = static_cast<double>(first_pos) + 1 + (steps - 1) / 2.0;
  const double kv_bytes = static_cast<double>(batch) * mean_len * c.kv_entry_dim() * 2.0 * c.num_hidden_layers;
  const double step_ms = Median(wall);
  const double roofline_ms = (weight_bytes + kv_bytes) / copy_bw * 1e3;
  DecodeResult r;
  r.roofline_fraction = roofline_ms / step_ms;
  r.step_ms = step_ms;
  r.idle_fraction = Mean(gaps) / Mean(periods);
  r.json = {{"batch", batch},
            {"variant", variant.name},
            {"context", context},
            {"steps", steps},
            {"cuda_graphs", graphs},
            {"programmatic_launch", variant.programmatic_launch},
            {"fused_decode_max_tokens", variant.fused_decode_max_tokens},
            {"moe_expert_gemv", variant.moe_expert_gemv},
            {"deterministic_moe_down", variant.deterministic_moe_down},
            {"moe_shared_experts_early", variant.moe_shared_experts_early},
            {"split_decode_queries", variant.split_decode_queries},
            {"sampling", variant.sample ? "top-p 0.9, temperature 0.7 (GPU)" : "greedy"},
            {"step_ms_p50", step_ms},
            {"step_ms_mean", Mean(wall)},
            {"step_ms_min", *std::min_element(wall.begin(), wall.end())},
            {"gpu_step_ms_mean", Mean(gpu)},
            {"idle_between_steps_ms_mean", Mean(gaps)},
            {"idle_fraction", r.idle_fraction},
            {"tokens_per_s", batch / (step_ms * 1e-3)},
            {"weight_bytes_per_step", weight_bytes},
            {"kv_bytes_per_step", kv_bytes},
            {"roofline_ms", roofline_ms},
            {"achieved_bandwidth_gbs", (weight_bytes + kv_bytes) / (step_ms * 1e-3) / 1e9},
            {"roofline_fraction", r.roofline_fraction}};
  if (profile) {
    model.set_profiling(true);
    step();
    OrDie(model.TakeProfile(), "profile");  // the first profiled step warms the events
    step();
    r.json["profile_ms"] = ProfileJson(OrDie(model.TakeProfile(), "profile"));
    model.set_profiling(false);
  }
  // What each kind of launch added to a step's chain (GPU timestamps between launches,
  // eager launches with programmatic launch as configured; CudaDeepseekModel::
  // set_kernel_timeline).
  if (timeline) {
    model.set_kernel_timeline(true);
    step();
    step();
    const auto timeline = OrDie(model.TakeKernelTimeline(), "kernel timeline");
    model.set_kernel_timeline(false);
    double sum = 0;
    for (const auto& [name, ms] : timeline) sum += ms;
    std::printf("kernel timeline, batch %d (ms per step, summed over layers; %.3f ms in all):\n", batch, sum);
    for (const auto& [name, ms] : timeline) std::printf("  %-45s %8.4f\n", name.c_str(), ms);
    r.json["timeline_ms"] = ProfileJson(timeline);
  }
  std::printf("decode batch %4d ctx %d %-22s: step %.3f ms (gpu %.3f, idle %.3f ms = %.1f%%), %.0f tok/s, "
              "roofline %.3f ms -> %.1f%%\n",
              batch, context, variant.name, step_ms, Mean(gpu), Mean(gaps), 100 * r.idle_fraction,
              batch / (step_ms * 1e-3), roofline_ms, 100 * r.roofline_fraction);
  std::fflush(stdout);
  return r;
}

// FLOPs of a prefill of n tokens (see the header comment).
double PrefillFlops(const ModelConfig& c, int64_t n) {
  const double hidden = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim(), v = c.v_head_dim;
  const double rank = c.kv_lora_rank, nope = c.qk_nope_head_dim;
  const double q_rows = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) : heads * qk;
  double per_token_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    double f = 2 * hidden * (q_rows + rank + c.qk_rope_head_dim);
    if (c.q_lora_rank) f += 2 * q_rows * heads * qk;
    f += 2 * rank * heads * (nope + v);  // kv_b expansion of this token's latent
    f += 2 * heads * v * hidden;         // o_proj
    if (c.IsMoeLayer(l)) {
      f += 2 * hidden * c.n_routed_experts;
      f += 2 * 3 * hidden * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts);
    } else {
      f += 2 * 3 * hidden * c.intermediate_size;
    }
    per_token_layers += f;
  }
  const double nn = static_cast<double>(n);
  const double attention = c.num_hidden_layers * heads * 2 * (qk + v) * nn * (nn + 1) / 2;
  return per_token_layers * nn + attention + 2 * hidden * c.vocab_size;
}

int Main(int argc, char** argv) {
  std::string config_file, model_dir, json_file;
  uint64_t seed = 0;
  int context = 1024, steps = 32, prefill = 8192, prefill_chunk = 2048, moe_grouped_max_tokens = -1;
  std::vector<int> batches = {1, 64, 256};
  bool profile = false, timeline = false, default_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") config_file = next();
    else if (a == "--model") model_dir = next();
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--context") context = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--prefill") prefill = std::stoi(next());
    else if (a == "--prefill-chunk") prefill_chunk = std::stoi(next());
    else if (a == "--moe-grouped-max-tokens") moe_grouped_max_tokens = std::stoi(next());
    else if (a == "--json") json_file = next();
    else if (a == "--profile") profile = true;
    else if (a == "--timeline") timeline = true;
    else if (a == "--default-only") default_only = true;
    else if (a == "--batches") {
      batches.clear();
      std::stringstream ss(next());
      for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoi(item));
    } else {
      std::fprintf(stderr,
                   "usage: cuda_model_bench (--config FILE [--seed S] | --model DIR) [--context N] [--steps N] "
                   "[--batches 1,64,256] [--prefill N] [--prefill-chunk N] [--moe-grouped-max-tokens N] [--profile] [--timeline] "
                   "[--default-only] [--json FILE]\n");
      return 2;
    }
  }
  if (config_file.empty() == model_dir.empty()) {
    std::fprintf(stderr, "give exactly one of --config and --model\n");
    return 2;
  }

  const double copy_bw = bench::DeviceCopyBytesPerSecond();
  const double gemm_rate = CublasRate(8192);
  std::printf("references: device-to-device copy %.0f GB/s (read + write), cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s\n",
              copy_bw / 1e9, gemm_rate / 1e12);
  std::fflush(stdout);

  const int max_batch = *std::max_element(batches.begin(), batches.end());
  CudaDeepseekModel::LoadOptions o;
  o.max_batch_tokens = std::max({prefill, max_batch, 64});  // the closeness check's prompts too
  o.fp8_decode = true;  // an FP8 checkpoint's FP8 forms loaded (compared with its bf16 copies below)
  o.fp8_prefill = true;  // and its prefill's dense GEMMs in FP8 (compared below too)
  if (moe_grouped_max_tokens >= 0) o.moe_grouped_max_tokens = moe_grouped_max_tokens;
  o.max_seqs = max_batch;
  o.max_context = std::max(prefill, context + steps + 8) + 64;
  const int64_t blocks_per_seq = (context + steps + 8 + 63) / 64;
  o.kv_blocks = max_batch * blocks_per_seq + (prefill + 63) / 64 + 8;
  const auto t0 = Clock::now();
  std::unique_ptr<CudaDeepseekModel> model;
  if (!config_file.empty()) {
    std::ifstream f(config_file);
    std::stringstream ss;
    ss << f.rdbuf();
    model = OrDie(CudaDeepseekModel::CreateGenerated(ss.str(), seed, o), "creating the model");
  } else {
    model = OrDie(CudaDeepseekModel::Load(model_dir, o), "loading the model");
  }
  const double load_s = Ms(t0, Clock::now()) / 1e3;
  const ModelConfig& c = model->config();
  std::printf("%s on %s: %.2f GB of weights, %.2f GB KV cache (%lld blocks), %.2f GB activations, ready in %.1f s\n",
              c.Summary().c_str(), model->device_name().c_str(), model->weight_bytes() / 1e9,
              model->kv_cache_bytes() / 1e9, static_cast<long long>(model->num_blocks()),
              model->activation_bytes() / 1e9, load_s);
  std::fflush(stdout);

  Json out;
  out["benchmark"] = "cuda_model";
  out["device"] = model->device_name();
  out["model"] = c.Summary();
  out["source"] = config_file.empty() ? "checkpoint " + model_dir
                                      : "generated on the GPU from " + config_file + " (make-model values, seed " +
                                            std::to_string(seed) + ")";
  out["weight_bytes"] = model->weight_bytes();
  const bool fp8_model = model->fp8_linears() > 0;
  out["fp8_linears"] = model->fp8_linears();
  out["fp8_weight_bytes"] = model->fp8_weight_bytes();
  Json closeness;
  if (fp8_model) {
    closeness = Fp8Closeness(*model, 5, 32);
    out["fp8_greedy_closeness"] = closeness;
  }
  out["reference"] = {{"copy_bandwidth_gbs", copy_bw / 1e9}, {"cublas_bf16_gemm_tflops", gemm_rate / 1e12}};

  Json decode = Json::array();
  Json acceptance = Json::object();
  if (fp8_model) acceptance["fp8_greedy_within_closeness_of_bf16"] = closeness["passed"];
  for (int b : batches) {
    const DecodeResult r = Decode(*model, b, context, steps, DecodeVariant{}, copy_bw, profile, timeline);
    decode.push_back(r.json);
    if (b == 1) acceptance["batch1_roofline_fraction_ge_0.6"] = r.roofline_fraction >= 0.6;
    // An FP8 checkpoint's decode on its bf16 copies, right after the FP8 row (same model,
    // same run): the FP8 forms' speed-up.
    if (fp8_model && b <= 4) {
      const DecodeResult bf = Decode(*model, b, context, steps,
                                     DecodeVariant{.name = "bf16 copies of the FP8 weights", .fp8_decode = false},
                                     copy_bw, false, timeline);
      decode.push_back(bf.json);
      // The FP8 forms with the tensor-core GEMV off (LoadOptions::fp8_tensor_cores).
      decode.push_back(Decode(*model, b, context, steps,
                              DecodeVariant{.name = "FP8 forms, scalar GEMVs", .fp8_tensor_cores = false}, copy_bw,
                              false, timeline)
                           .json);
      const double ratio = bf.step_ms / r.step_ms;
      std::printf("batch %d: FP8 forms %.3f ms a step, bf16 copies %.3f ms: %.2fx as fast\n", b, r.step_ms,
                  bf.step_ms, ratio);
      if (b == 1) {
        acceptance["batch1_fp8_faster_than_bf16"] = ratio > 1.0;
        out["fp8_vs_bf16_batch1_speedup"] = ratio;
      }
    }
    if (b == 256) acceptance["batch256_roofline_fraction_ge_0.5"] = r.roofline_fraction >= 0.5;
    if (b == 64) acceptance["batch64_idle_fraction_lt_0.05"] = r.idle_fraction < 0.05;
    // The grouped GEMM for the experts instead of the GEMVs (a difference only where the
    // fused small-batch kernels run), right after the default row for a like comparison.
    if (b <= 64 && !default_only) {
      decode.push_back(Decode(*model, b, context, steps, DecodeVariant{.name = "no expert GEMV",
                                                                        .moe_expert_gemv = false},
                              copy_bw, profile)
                           .json);
    }
    // Bf16 decode queries where the split ones apply (steps of at most 64 tokens), but for
    // batch 1 (among the variants below).
    if (b > 1 && b <= 64 && !default_only) {
      decode.push_back(Decode(*model, b, context, steps,
                              DecodeVariant{.name = "bf16 decode queries", .split_decode_queries = false}, copy_bw,
                              profile)
                           .json);
    }
  }
  const int b0 = batches.front();
  const std::vector<DecodeVariant> variants = {
      DecodeVariant{.name = "no PDL", .programmatic_launch = false},
      DecodeVariant{.name = "no PDL, unfused", .programmatic_launch = false, .fused_decode_max_tokens = 0},
      DecodeVariant{.name = "no graphs", .graphs = false},
      DecodeVariant{.name = "ordered MoE down sums", .deterministic_moe_down = true},
      DecodeVariant{.name = "shared experts after routing", .moe_shared_experts_early = false},
      DecodeVariant{.name = "bf16 decode queries", .split_decode_queries = false}};
  for (const DecodeVariant& v : default_only ? std::vector<DecodeVariant>{} : variants) {
    decode.push_back(Decode(*model, b0, context, steps, v, copy_bw, false).json);
  }
  for (int b : batches) {
    if (b > 64 || default_only) continue;
    decode.push_back(Decode(*model, b, context, steps, DecodeVariant{.name = "GPU sampling", .sample = true}, copy_bw,
                            false)
                         .json);
  }
  model->set_programmatic_launch(true);
  model->set_fused_decode_max_tokens(4);
  model->set_moe_expert_gemv(true);
  model->set_deterministic_moe_down(false);
  model->set_moe_shared_experts_early(true);
  model->set_split_decode_queries(true);
  model->set_fp8_decode(true);
  model->set_fp8_tensor_cores(true);
  model->set_cuda_graphs(true);
  out["decode"] = decode;

  if (prefill > 0) {
    std::vector<int32_t> prompt(prefill), table((prefill + 63) / 64);
    for (int i = 0; i < prefill; ++i) prompt[i] = static_cast<int32_t>(3 + (i * 104729) % (c.vocab_size - 3));
    std::iota(table.begin(), table.end(), static_cast<int32_t>(model->num_blocks() - table.size()));
    ForwardSequence s{.tokens = prompt, .start_position = 0, .block_table = table};
    auto time_prefill = [&] {
      OrDie(model->ForwardGreedy({&s, 1}), "prefill");  // warm-up
      std::vector<double> ms;
      for (int i = 0; i < 3; ++i) {
        const auto a = Clock::now();
        OrDie(model->ForwardGreedy({&s, 1}), "prefill");
        ms.push_back(Ms(a, Clock::now()));
      }
      return ms;
    };
    const std::vector<double> ms = time_prefill();
    const double flops = PrefillFlops(c, prefill);
    const double best = *std::min_element(ms.begin(), ms.end());
    const double rate = flops / (best * 1e-3);
    Json p = {{"tokens", prefill},
              {"ms_best", best},
              {"ms_median", Median(ms)},
              {"tokens_per_s", prefill / (best * 1e-3)},
              {"flops", flops},
              {"tflops", rate / 1e12},
              {"fraction_of_cublas", rate / gemm_rate}};
    if (profile) {
      model->set_profiling(true);
      OrDie(model->ForwardGreedy({&s, 1}), "prefill");
      p["profile_ms"] = ProfileJson(OrDie(model->TakeProfile(), "profile"));
      model->set_profiling(false);
    }
    std::printf("prefill %d tokens: %.1f ms (%.0f tok/s), %.1f TFLOP/s = %.1f%% of cuBLAS\n", prefill, best,
                prefill / (best * 1e-3), rate / 1e12, 100 * rate / gemm_rate);
    if (fp8_model) {
      // The same prefill with every GEMM on the bf16 copies (LoadOptions::fp8_prefill off).
      model->set_fp8_prefill(false);
      const std::vector<double> bms = time_prefill();
      model->set_fp8_prefill(true);
      const double bbest = *std::min_element(bms.begin(), bms.end());
      p["bf16_copies_ms_best"] = bbest;
      p["fp8_over_bf16_copies_speedup"] = bbest / best;
      std::printf("prefill %d tokens on the bf16 copies: %.1f ms: the FP8 GEMMs %.2fx as fast\n", prefill, bbest,
                  bbest / best);
    }
    if (prefill_chunk > 0 && prefill_chunk < prefill) {
      // The same prompt in chunks of prefill_chunk tokens, one forward pass each (what a
      // worker does with --max-batch-tokens prefill_chunk): later chunks attend to the
      // cached prefix.
      auto chunked = [&] {
        for (int begin = 0; begin < prefill; begin += prefill_chunk) {
          const int n = std::min(prefill_chunk, prefill - begin);
          ForwardSequence piece{.tokens = std::span<const int32_t>(prompt).subspan(begin, n),
                                .start_position = begin, .block_table = table};
          OrDie(model->ForwardGreedy({&piece, 1}), "chunked prefill");
        }
      };
      chunked();  // warm-up
      std::vector<double> cms;
      for (int i = 0; i < 3; ++i) {
        const auto a = Clock::now();
        chunked();
        cms.push_back(Ms(a, Clock::now()));
      }
      const double cbest = *std::min_element(cms.begin(), cms.end());
      Json cj = {{"chunk_tokens", prefill_chunk}, {"ms_best", cbest}, {"ms_median", Median(cms)},
                 {"ratio_to_one_pass", cbest / best}};
      if (profile) {
        model->set_profiling(true);
        chunked();
        cj["profile_ms"] = ProfileJson(OrDie(model->TakeProfile(), "profile"));
        model->set_profiling(false);
      }
      std::printf("prefill %d tokens in chunks of %d: %.1f ms (%.2fx one pass)\n", prefill, prefill_chunk, cbest,
                  cbest / best);
      p["chunked"] = cj;
    }
    out["prefill"] = p;
    acceptance["prefill_fraction_of_cublas_ge_0.35"] = rate / gemm_rate >= 0.35;
  }
  out["acceptance"] = acceptance;
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    f << text << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
