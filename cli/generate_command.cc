#include "cli/generate_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/deepseek_model.h"
#include "engine/model/model_resolver.h"
#include "cli/validators.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem::cli {
namespace {

struct GenerateArgs {
  std::string prompt;
  std::string model = "tiny";
  bool local = false;
  std::string addr;
  int max_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int threads = 0;
};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int32_t Sample(const float* logits, int64_t vocab, const GenerateArgs& a, std::mt19937_64& rng) {
  if (a.temperature <= 0.0) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = a.top_k > 0 ? std::min<int64_t>(a.top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t x, int32_t y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); });
  ids.resize(static_cast<size_t>(k));
  std::vector<double> p(ids.size());
  const double m = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[ids[i]] - m) / a.temperature);
  double kept = 0;
  size_t n = 0;
  for (; n < p.size(); ++n) {
    p[n] /= sum;
    kept += p[n];
    if (kept >= a.top_p) {
      ++n;
      break;
    }
  }
  n = std::min(n, p.size());
  std::uniform_real_distribution<double> u(0.0, kept > 0 ? std::min(kept, 1.0) : 1.0);
  double r = u(rng);
  for (size_t i = 0; i < n; ++i) {
    r -= p[i];
    if (r <= 0) return ids[i];
  }
  return ids[n - 1];
}

int RunLocal(const GenerateArgs& a) {
  absl::StatusOr<std::string> dir = ResolveModelDir(a.model);
  if (!dir.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  const auto t_load = Clock::now();
  DeepseekModel::LoadOptions load;
  load.num_threads = a.threads;
  absl::StatusOr<std::unique_ptr<DeepseekModel>> model = DeepseekModel::Load(*dir, load);
  if (!model.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDir(*dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const ModelConfig& config = (*model)->config();
  std::fprintf(stderr, "model %s (%s), loaded in %.2f s\n", dir->c_str(), config.Summary().c_str(),
               Seconds(t_load, Clock::now()));

  std::vector<int32_t> prompt = (*tokenizer)->Encode(a.prompt, /*add_special_tokens=*/true);
  if (prompt.empty()) {
    std::fprintf(stderr, "tandem generate: the prompt is empty\n");
    return 2;
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_tokens;
  if (total > config.max_position_embeddings) {
    std::fprintf(stderr, "tandem generate: prompt (%zu tokens) + max tokens (%d) exceed the context (%lld)\n",
                 prompt.size(), a.max_tokens, static_cast<long long>(config.max_position_embeddings));
    return 2;
  }
  const int64_t blocks = (total + kKvBlockSize - 1) / kKvBlockSize;
  LatentKvCache cache = (*model)->MakeKvCache(blocks);
  std::vector<int32_t> block_table(static_cast<size_t>(blocks));
  std::iota(block_table.begin(), block_table.end(), 0);

  std::mt19937_64 rng(a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}());
  StreamingDetokenizer detok(**tokenizer, /*skip_special_tokens=*/true);
  std::vector<int64_t> eos = config.eos_token_ids;
  if ((*tokenizer)->eos_id()) eos.push_back(*(*tokenizer)->eos_id());
  size_t max_stop = 0;
  for (const auto& s : a.stop) max_stop = std::max(max_stop, s.size());

  std::string text;  // all text so far; text[0, printed) is on stdout
  size_t printed = 0;
  std::string finish = "length";
  const auto t0 = Clock::now();
  Clock::time_point t_first;
  int generated = 0;
  std::vector<int32_t> step(prompt);
  int64_t position = 0;
  bool stop_hit = false;
  while (generated < a.max_tokens) {
    ForwardSequence seq{.tokens = step, .start_position = position, .block_table = block_table};
    absl::StatusOr<std::vector<float>> logits = (*model)->Forward({&seq, 1}, cache);
    if (!logits.ok()) {
      std::fprintf(stderr, "\ntandem generate: %s\n", std::string(logits.status().message()).c_str());
      return 1;
    }
    position += static_cast<int64_t>(step.size());
    const int32_t token = Sample(logits->data(), config.vocab_size, a, rng);
    if (generated == 0) t_first = Clock::now();
    ++generated;
    if (!a.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      finish = "stop";
      break;
    }
    text += detok.Push(token);
    for (const auto& s : a.stop) {
      const size_t at = text.find(s);
      if (!s.empty() && at != std::string::npos) {
        text.resize(at);
        stop_hit = true;
      }
    }
    // Print all but the tail that could still begin a stop string.
    const size_t safe = stop_hit ? text.size() : (text.size() > max_stop ? text.size() - (max_stop ? max_stop - 1 : 0) : 0);
    if (safe > printed) {
      std::fwrite(text.data() + printed, 1, safe - printed, stdout);
      std::fflush(stdout);
      printed = safe;
    }
    if (stop_hit) {
      finish = "stop";
      break;
    }
    step.assign(1, token);
  }
  if (!stop_hit) {
    text += detok.Finish();
    std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const auto t_end = Clock::now();
  const double decode_s = generated > 1 ? Seconds(t_first, t_end) : 0.0;
  std::fprintf(stderr,
               "finish: %s | prompt tokens: %zu | generated tokens: %d | TTFT: %.1f ms | decode: %.1f tokens/s\n",
               finish.c_str(), prompt.size(), generated, generated ? Seconds(t0, t_first) * 1e3 : 0.0,
               decode_s > 0 ? (generated - 1) / decode_s : 0.0);
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text for a prompt, streaming it to stdout "
                                                  "(usage and timings go to stderr).");
  cmd->add_option("prompt", args->prompt, "The prompt text")->required();
  cmd->add_flag("--local", args->local, "Run the engine in this process instead of calling a server");
  cmd->add_option("--addr", args->addr, "Router address HOST:PORT (not available yet: use --local)")
      ->envname("TANDEM_ADDR");
  cmd->add_option("--model", args->model, "Checkpoint directory or built-in model (tiny, tiny-v2)")
      ->envname("TANDEM_MODEL")
      ->capture_default_str();
  cmd->add_option("--max-tokens", args->max_tokens, "Maximum tokens to generate")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (0 = greedy)")
      ->check(FiniteRange(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass")->check(FiniteRange(0.0, 1.0))->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Sample from the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed (default: random)");
  cmd->add_option("--stop", args->stop, "Stop string (repeatable); not included in the output");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past the end-of-sequence token");
  cmd->add_option("--threads", args->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->callback([args, exit_code] {
    if (!args->local) {
      std::fprintf(stderr, "tandem generate: serving is not built yet; use --local\n");
      *exit_code = 2;
      return;
    }
    *exit_code = RunLocal(*args);
  });
}

}  // namespace tandem::cli
