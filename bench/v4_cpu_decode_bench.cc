// DeepSeek-V4 CPU decode at batch 1 against the memory-read roofline measured in the
// same run (bench/read_bandwidth.h), as cpu_decode_bench does for V2/V3.
//
//   v4_cpu_decode_bench --model DIR [--threads N] [--prompt-len P] [--steps S] [--json FILE]
//
// Bytes a step reads: bench/v4_decode_bytes.h (FP4 experts counted as the bf16 the CPU
// widens them to and reads). Two paths are timed on the same prompt: the model's own state
// (DeepseekV4Model::Forward) and the served path over the paged pool (PagedV4Model, which
// copies each sequence's state in and out per step); `paged_over_state` is the served
// path's speed relative to the state path.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "bench/read_bandwidth.h"
#include "bench/v4_decode_bytes.h"
#include "engine/model/deepseek_v4/v4_paged_model.h"
#include "nlohmann/json.hpp"

namespace tandem::v4 {
namespace {

using Clock = std::chrono::steady_clock;
using bench_bytes::KvBytesPerToken;
using bench_bytes::WeightBytesPerToken;
using bench::Percentile;
using bench::SecondsBetween;


int Main(int argc, char** argv) {
  std::string model_dir, json_path;
  int threads = 0, prompt_len = 512, steps = 32;
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
    std::fprintf(stderr, "v4_cpu_decode_bench: --model DIR (a deepseek_v4 checkpoint) is required\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<PagedV4Model>> loaded = PagedV4Model::Load(model_dir, {.num_threads = threads});
  if (!loaded.ok()) {
    std::fprintf(stderr, "v4_cpu_decode_bench: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  PagedV4Model& paged = **loaded;
  DeepseekV4Model& m = paged.model();
  const DeepseekV4Config& c = m.config();
  cpu::ThreadPool& pool = m.thread_pool();
  const uint64_t weight_bytes = WeightBytesPerToken(c, m.weights());
  std::fprintf(stderr, "model: %s\nweights read per decode step: %.1f MiB; measuring bandwidth ...\n",
               c.Summary().c_str(), weight_bytes / 1048576.0);
  const double read_bw = bench::ReadBandwidth(pool, size_t{1} << 30, 5);
  const double copy_bw = bench::CopyBandwidth(pool, size_t{1} << 29, 5);

  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int i = 0; i < prompt_len; ++i) prompt[i] = 3 + (i * 7919) % static_cast<int>(c.vocab_size - 3);
  auto argmax = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };

  // The state path.
  SequenceState state = m.NewSequence();
  absl::StatusOr<std::vector<float>> logits = m.Forward(prompt, state, /*all_logits=*/false);
  if (!logits.ok()) return 1;
  std::vector<double> state_s;
  std::vector<int32_t> generated;
  for (int s = 0; s < steps; ++s) {
    const int32_t token = argmax(*logits);
    generated.push_back(token);
    const auto t0 = Clock::now();
    logits = m.Forward({&token, 1}, state, false);
    state_s.push_back(SecondsBetween(t0, Clock::now()));
    if (!logits.ok()) return 1;
  }

  // The served path over the paged pool, the same tokens.
  const int64_t total = prompt_len + steps;
  const int64_t blocks = (total + 63) / 64;
  absl::StatusOr<std::unique_ptr<KvPool>> kv = KvPool::Create(
      paged.kv_streams(),
      {.num_layers = static_cast<int32_t>(c.num_hidden_layers), .block_size = 64, .num_blocks = blocks,
       .num_sequence_slots = 1});
  if (!kv.ok()) {
    std::fprintf(stderr, "v4_cpu_decode_bench: %s\n", std::string(kv.status().message()).c_str());
    return 1;
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  ForwardSequence q{.tokens = prompt, .start_position = 0, .block_table = table, .state_slot = 0};
  logits = paged.Forward({&q, 1}, **kv);
  if (!logits.ok()) return 1;
  std::vector<double> paged_s;
  bool same_tokens = true;
  for (int s = 0; s < steps; ++s) {
    const int32_t token = argmax(*logits);
    same_tokens = same_tokens && token == generated[s];
    q = {.tokens = {&token, 1}, .start_position = prompt_len + s, .block_table = table, .state_slot = 0};
    const auto t0 = Clock::now();
    logits = paged.Forward({&q, 1}, **kv);
    paged_s.push_back(SecondsBetween(t0, Clock::now()));
    if (!logits.ok()) return 1;
  }

  const double kv_bytes = KvBytesPerToken(c, prompt_len + steps / 2);
  const double bytes_per_step = static_cast<double>(weight_bytes) + kv_bytes;
  const double median = Percentile(state_s, 0.5), paged_median = Percentile(paged_s, 0.5);
  nlohmann::ordered_json out = {
      {"benchmark", "v4_cpu_decode_batch1"},
      {"model", model_dir},
      {"model_summary", c.Summary()},
      {"threads", pool.num_threads()},
      {"prompt_len", prompt_len},
      {"decode_steps", steps},
      {"step_ms", {{"p50", 1e3 * median}, {"p90", 1e3 * Percentile(state_s, 0.9)},
                   {"min", 1e3 * *std::min_element(state_s.begin(), state_s.end())}}},
      {"paged_step_ms", {{"p50", 1e3 * paged_median}, {"p90", 1e3 * Percentile(paged_s, 0.9)}}},
      {"tokens_per_s", 1.0 / median},
      {"paged_tokens_per_s", 1.0 / paged_median},
      {"paged_over_state", median / paged_median},
      {"paged_same_tokens", same_tokens},
      {"weight_bytes_per_step", weight_bytes},
      {"kv_bytes_per_step", kv_bytes},
      {"reference_read_bandwidth_gbs", read_bw / 1e9},
      {"reference_copy_bandwidth_gbs", copy_bw / 1e9},
      {"achieved_bandwidth_gbs", bytes_per_step / median / 1e9},
      {"fraction_of_read_roofline", bytes_per_step / median / read_bw},
      {"paged_fraction_of_read_roofline", bytes_per_step / paged_median / read_bw},
      {"goal_reference", "read roofline: bytes read per step / streaming read bandwidth"},
  };
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  std::fprintf(stderr, "V4 decode at batch 1: %.2f of the read roofline (%.2f GB/s streaming read); paged %.2f\n",
               bytes_per_step / median / read_bw, read_bw / 1e9, bytes_per_step / paged_median / read_bw);
  if (!json_path.empty()) {
    if (std::FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", text.c_str());
      std::fclose(f);
    }
  }
  return same_tokens ? 0 : 1;
}

}  // namespace
}  // namespace tandem::v4

int main(int argc, char** argv) { return tandem::v4::Main(argc, argv); }
