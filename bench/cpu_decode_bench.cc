// CPU decode at batch 1 against the memory-bandwidth roofline measured in the same run.
//
//   cpu_decode_bench --model DIR [--threads N] [--prompt-len P] [--steps S] [--json FILE]
//
// Decode at batch 1 reads every weight it uses once per token, so its ceiling is
// (bytes read per step) / (streaming read bandwidth): the read roofline, the reference
// the goal is stated against (`fraction_of_read_roofline`). Both references are measured
// here, in the same run and with the same threads: a streaming read (the sum of a buffer
// larger than the caches: what decode does) and, for context only, memcpy's rate in bytes
// copied per second (`fraction_of_copy_rate`). A copy moves each byte twice (read and
// write), so on most machines its rate is well below the read bandwidth and a fraction
// of it flatters decode: on one 2-core machine with a 32 GB/s streaming read, 0.30 of the
// read roofline was 0.77 of the copy rate. The bytes per step count what a token touches:
// its embedding row, all attention and dense weights, the router, the experts it is routed
// to (num_experts_per_tok of each MoE layer), the shared experts, the LM head and the
// latent KV it attends over.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench/read_bandwidth.h"
#include "engine/model/deepseek_model.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using bench::CopyBandwidth;
using bench::MatrixBytes;
using bench::Percentile;
using bench::ReadBandwidth;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }


uint64_t MlpBytes(const MlpWeights& m) { return MatrixBytes(m.gate) + MatrixBytes(m.up) + MatrixBytes(m.down); }

// Weight bytes one decode step at batch 1 reads.
uint64_t WeightBytesPerToken(const DeepseekModel& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  uint64_t bytes = static_cast<uint64_t>(c.hidden_size) * DTypeSize(w.embed.dtype);  // one embedding row
  for (const DecoderLayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attention;
    bytes += MatrixBytes(a.q_proj) + MatrixBytes(a.q_a_proj) + MatrixBytes(a.q_b_proj) + MatrixBytes(a.kv_a_proj) +
             MatrixBytes(a.kv_b_proj) + MatrixBytes(a.o_proj);
    if (l.mlp) bytes += MlpBytes(*l.mlp);
    if (l.moe) {
      bytes += MatrixBytes(l.moe->router) + c.num_experts_per_tok * MlpBytes(l.moe->experts[0]);
      if (l.moe->shared) bytes += MlpBytes(*l.moe->shared);
    }
  }
  return bytes + MatrixBytes(w.lm_head);
}


int Main(int argc, char** argv) {
  std::string model_dir, json_path;
  int threads = 0, prompt_len = 32, steps = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") model_dir = next();
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--prompt-len") prompt_len = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "usage: %s --model DIR [--threads N] [--prompt-len P] [--steps S] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (model_dir.empty() || prompt_len < 1 || steps < 1) {
    std::fprintf(stderr, "cpu_decode_bench: --model DIR is required (see bench/README.md)\n");
    return 2;
  }
  DeepseekModel::LoadOptions lo;
  lo.num_threads = threads;
  absl::StatusOr<std::unique_ptr<DeepseekModel>> model = DeepseekModel::Load(model_dir, lo);
  if (!model.ok()) {
    std::fprintf(stderr, "cpu_decode_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  DeepseekModel& m = **model;
  const ModelConfig& c = m.config();
  cpu::ThreadPool& pool = m.thread_pool();

  const uint64_t weight_bytes = WeightBytesPerToken(m);
  std::fprintf(stderr, "model: %s\nweights read per decode step: %.1f MiB; measuring bandwidth ...\n",
               c.Summary().c_str(), weight_bytes / 1048576.0);
  const size_t probe = 1ull << 30;
  const double read_bw = ReadBandwidth(pool, probe, 5);
  const double copy_bw = CopyBandwidth(pool, probe / 2, 5);

  const int64_t total = prompt_len + steps;
  LatentKvCache cache = m.MakeKvCache((total + kKvBlockSize - 1) / kKvBlockSize);
  std::vector<int32_t> table(static_cast<size_t>(cache.num_blocks()));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) prompt[i] = 3 + (i * 7919) % static_cast<int>(c.vocab_size - 3);
  ForwardSequence seq{.tokens = prompt, .start_position = 0, .block_table = table};
  absl::StatusOr<std::vector<float>> logits = m.Forward({&seq, 1}, cache);
  if (!logits.ok()) {
    std::fprintf(stderr, "cpu_decode_bench: %s\n", std::string(logits.status().message()).c_str());
    return 1;
  }
  std::vector<double> step_s;
  int32_t token = 0;
  for (int s = 0; s < steps; ++s) {
    token = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    seq = {.tokens = {&token, 1}, .start_position = prompt_len + s, .block_table = table};
    const auto t0 = Clock::now();
    logits = m.Forward({&seq, 1}, cache);
    step_s.push_back(Seconds(t0, Clock::now()));
    if (!logits.ok()) return 1;
  }
  // The latent KV attended over, at the average context of the run.
  const double kv_bytes = static_cast<double>(prompt_len + steps / 2) * c.kv_entry_dim() * 4 * c.num_hidden_layers;
  const double median = Percentile(step_s, 0.5);
  const double bytes_per_step = static_cast<double>(weight_bytes) + kv_bytes;
  nlohmann::ordered_json out = {
      {"benchmark", "cpu_decode_batch1"},
      {"model", model_dir},
      {"model_summary", c.Summary()},
      {"threads", pool.num_threads()},
      {"prompt_len", prompt_len},
      {"decode_steps", steps},
      {"step_ms", {{"mean", 1e3 * std::accumulate(step_s.begin(), step_s.end(), 0.0) / steps},
                   {"p50", 1e3 * median},
                   {"p90", 1e3 * Percentile(step_s, 0.9)},
                   {"min", 1e3 * *std::min_element(step_s.begin(), step_s.end())}}},
      {"tokens_per_s", 1.0 / median},
      {"weight_bytes_per_step", weight_bytes},
      {"kv_bytes_per_step", kv_bytes},
      {"reference_read_bandwidth_gbs", read_bw / 1e9},
      {"reference_copy_bandwidth_gbs", copy_bw / 1e9},
      {"achieved_bandwidth_gbs", bytes_per_step / median / 1e9},
      {"fraction_of_read_roofline", bytes_per_step / median / read_bw},
      {"fraction_of_copy_rate", bytes_per_step / median / copy_bw},
      {"goal_reference", "read roofline: bytes read per step / streaming read bandwidth"},
  };
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  std::fprintf(stderr,
               "decode at batch 1: %.2f GB/s = %.2f of the read roofline (%.2f GB/s streaming read; the goal's "
               "reference), %.2f of memcpy's copy rate (%.2f GB/s copied; context only)\n",
               bytes_per_step / median / 1e9, bytes_per_step / median / read_bw, read_bw / 1e9,
               bytes_per_step / median / copy_bw, copy_bw / 1e9);
  if (!json_path.empty()) {
    if (std::FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", text.c_str());
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
