// What the CPU pays for running every prefill position in the absorbed attention form
// (AttentionForm::kAuto, so that a re-prefill reproduces decode bitwise) instead of the
// expanded form, measured in the same run on the same model:
//
//   cpu_prefill_attention_bench --model DIR [--threads N] [--lens 128,512,2048] [--reps R] [--json FILE]
//
// For each prompt length, the best of R whole-prompt Forward passes (one chunk from
// position 0) per form; reports seconds, tokens/s and absorbed / expanded.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model/deepseek_model.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// Best of `reps` prefills of `len` tokens in `form`, in seconds (-1 on error).
double PrefillSeconds(DeepseekModel& m, int len, AttentionForm form, int reps) {
  const ModelConfig& c = m.config();
  LatentKvCache cache = m.MakeKvCache((len + kKvBlockSize - 1) / kKvBlockSize);
  std::vector<int32_t> table(static_cast<size_t>(cache.num_blocks()));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> prompt(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) prompt[i] = 3 + (i * 7919) % static_cast<int>(c.vocab_size - 3);
  ForwardSequence seq{.tokens = prompt, .start_position = 0, .block_table = table};
  double best = -1;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    if (!m.Forward({&seq, 1}, cache, {.attention = form}).ok()) return -1;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = best < 0 ? s : std::min(best, s);
  }
  return best;
}

int Main(int argc, char** argv) {
  std::string model_dir, json_path, lens_arg = "128,512,2048";
  int threads = 0, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") model_dir = next();
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--lens") lens_arg = next();
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "usage: %s --model DIR [--threads N] [--lens 128,512,2048] [--reps R] [--json FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<int> lens;
  for (absl::string_view s : absl::StrSplit(lens_arg, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      std::fprintf(stderr, "cpu_prefill_attention_bench: --lens: '%s' is not a positive length\n", std::string(s).c_str());
      return 2;
    }
    lens.push_back(n);
  }
  if (model_dir.empty() || reps < 1 || lens.empty()) {
    std::fprintf(stderr, "cpu_prefill_attention_bench: --model DIR is required (see bench/README.md)\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<DeepseekModel>> model = DeepseekModel::Load(model_dir, {.num_threads = threads});
  if (!model.ok()) {
    std::fprintf(stderr, "cpu_prefill_attention_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  DeepseekModel& m = **model;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int len : lens) {
    const double expanded = PrefillSeconds(m, len, AttentionForm::kExpanded, reps);
    const double absorbed = PrefillSeconds(m, len, AttentionForm::kAbsorbed, reps);
    if (expanded < 0 || absorbed < 0) {
      std::fprintf(stderr, "cpu_prefill_attention_bench: a forward pass of %d tokens failed\n", len);
      return 1;
    }
    rows.push_back({{"prompt_len", len},
                    {"expanded_s", expanded},
                    {"absorbed_s", absorbed},
                    {"expanded_tokens_per_s", len / expanded},
                    {"absorbed_tokens_per_s", len / absorbed},
                    {"absorbed_over_expanded", absorbed / expanded},
                    {"absorbed_cheaper_by_count", m.config().AbsorbedAttentionCheaper(len, 0)}});
    std::fprintf(stderr, "%d tokens: expanded %.3f s, absorbed %.3f s (x%.2f)\n", len, expanded, absorbed,
                 absorbed / expanded);
  }
  nlohmann::ordered_json out = {{"benchmark", "cpu_prefill_attention_forms"},
                                {"model", model_dir},
                                {"model_summary", m.config().Summary()},
                                {"threads", m.thread_pool().num_threads()},
                                {"reps", reps},
                                {"prefill", rows}};
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
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
