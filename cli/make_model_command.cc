#include "cli/make_model_command.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_join.h"
#include "engine/model/deepseek_v4/v4_generator.h"
#include "engine/model/model_generator.h"
#include "engine/model/model_resolver.h"
#include "engine/util/mapped_file.h"

namespace tandem::cli {
namespace {

struct MakeModelArgs {
  std::string preset;
  std::string config_file;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  int shards = 1;
  std::string tokenizer_dir;
  bool generated_tokenizer = false;
  int64_t vocab_size = 0;
  bool weights_on_gpu = false;
  std::optional<double> mtp_acceptance;
};

int Run(const MakeModelArgs& a) {
  ModelGeneratorOptions options;
  if (!a.config_file.empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(a.config_file);
    if (!text.ok()) {
      std::fprintf(stderr, "tandem make-model: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    options.config_json = *text;
  } else {
    const std::string name = a.preset.empty() ? "tiny" : a.preset;
    absl::StatusOr<std::string> preset = PresetConfig(name);
    if (!preset.ok() && v4::V4PresetConfig(name).ok()) preset = v4::V4PresetConfig(name);
    if (!preset.ok()) {
      std::vector<std::string> names = PresetNames();
      for (const std::string& n : v4::V4PresetNames()) names.push_back(n);
      std::fprintf(stderr, "tandem make-model: unknown preset '%s' (presets: %s)\n", name.c_str(),
                   absl::StrJoin(names, ", ").c_str());
      return 2;
    }
    options.config_json = *preset;
  }
  options.seed = a.seed;
  if (a.dtype == "bf16") options.weight_dtype = DType::kBF16;
  else if (a.dtype == "f32") options.weight_dtype = DType::kF32;
  else if (a.dtype == "fp8") options.weight_dtype = DType::kF8E4M3;
  options.num_shards = a.shards;
  options.tokenizer_dir = a.generated_tokenizer ? "" : (a.tokenizer_dir.empty() ? DefaultTokenizerDir() : a.tokenizer_dir);
  if (a.vocab_size > 0) options.generated_vocab_size = a.vocab_size;
  options.write_weights = !a.weights_on_gpu;
  options.mtp_acceptance = a.mtp_acceptance;

  std::fprintf(stderr, "tandem make-model: writing %s ...\n", a.out.c_str());
  // Progress for long writes: a live line on a terminal, every 10% otherwise.
  const bool tty = ::isatty(2) != 0;
  auto last_decile = std::make_shared<int>(-1);
  options.progress = [tty, last_decile](uint64_t done, uint64_t total) {
    if (total < (256ull << 20)) return;  // small models finish before anyone looks
    const int pct = static_cast<int>(100.0 * done / total);
    if (tty) {
      std::fprintf(stderr, "\r  %3d%%  %.2f / %.2f GiB", pct, done / 1073741824.0, total / 1073741824.0);
      if (done == total) std::fputc('\n', stderr);
    } else if (pct / 10 != *last_decile) {
      *last_decile = pct / 10;
      std::fprintf(stderr, "  %3d%%  %.2f / %.2f GiB\n", pct, done / 1073741824.0, total / 1073741824.0);
    }
  };
  // DeepSeek-V4 has a generator of its own (engine/model/deepseek_v4), above the V2/V3 one.
  absl::StatusOr<GeneratedModel> model = v4::IsDeepseekV4Config(options.config_json)
                                             ? v4::GenerateDeepseekV4Model(options, a.out)
                                             : GenerateModel(options, a.out);
  if (!model.ok()) {
    std::fprintf(stderr, "tandem make-model: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "tandem make-model: %s: %.2fM parameters, %.1f MiB of weights (%s%s), tokenizer: %s\n",
               model->dir.c_str(), model->num_parameters / 1e6, model->weight_bytes / 1048576.0, a.dtype.c_str(),
               a.weights_on_gpu ? ", generated on the GPU at load" : "", model->tokenizer.c_str());
  if (a.mtp_acceptance) {
    std::fprintf(stderr,
                 "tandem make-model: a speculative-decoding test construction (MTP drafts right for %.3g of "
                 "tokens), not a language model\n",
                 *a.mtp_acceptance);
  }
  return 0;
}

}  // namespace

void RegisterMakeModel(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a deterministic random-weight checkpoint in Hugging Face format (config.json, safetensors, "
      "tokenizer.json, tokenizer_config.json).");
  std::vector<std::string> presets = PresetNames();
  for (const std::string& name : v4::V4PresetNames()) presets.push_back(name);
  auto* preset = cmd->add_option("--preset", args->preset,
                                 "Built-in architecture: " + absl::StrJoin(presets, ", ") + " (default: tiny)");
  auto* config = cmd->add_option("--config", args->config_file,
                                 "A Hugging Face config.json giving the architecture (e.g. DeepSeek-V2-Lite's "
                                 "with fewer layers); vocab_size may be omitted")
                     ->check(CLI::ExistingFile);
  preset->excludes(config);
  cmd->add_option("--out", args->out, "Output directory (created)")->required();
  cmd->add_option("--seed", args->seed, "Seed of the random weights")->capture_default_str();
  cmd->add_option("--dtype", args->dtype,
                  "Weight type: bf16, f32 or fp8 (e4m3 with 128x128 block scales; DeepSeek-V4 also writes FP4 "
                  "routed experts with per-32 scales, as its official checkpoints do)")
      ->check(CLI::IsMember({"bf16", "f32", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--shards", args->shards, "Number of safetensors shards (>1 writes an index)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--tokenizer-dir", args->tokenizer_dir,
                  "Directory with DeepSeek-V3's tokenizer.json and tokenizer_config.json (default: the copy "
                  "scripts/install-deps.sh installs)");
  cmd->add_flag("--generated-tokenizer", args->generated_tokenizer,
                "Always generate a byte-level BPE tokenizer sized to vocab_size");
  cmd->add_option("--vocab-size", args->vocab_size,
                  "Vocabulary of a generated tokenizer when the config gives none (default 1024)");
  cmd->add_flag("--weights-on-gpu", args->weights_on_gpu,
                "Write no weight files: --device cuda workers generate the same bf16 weights on the GPU at load "
                "(for serving benchmarks of large random-weight models; the CPU cannot run such a checkpoint)");
  cmd->add_option("--mtp-acceptance", args->mtp_acceptance,
                  "Write a TEST CONSTRUCTION, not a real model, for measuring speculative decoding at a known "
                  "acceptance rate P in [0, 1]: the greedy next token is a fixed successor of the current one "
                  "(a cycle over the non-special tokens), and the MTP layer drafts it right for a random "
                  "fraction P of tokens, so about P of first drafts are accepted and P^j of chains of j. The "
                  "decoder layers keep random weights scaled down. DeepSeek-V3 configs with an MTP layer "
                  "(e.g. --preset tiny), bf16 or f32 (with --weights-on-gpu bf16, built by the CUDA backend at "
                  "load); config.json records it "
                  "under \"tandem_mtp_test\" (engine/model/mtp_test_model.h)");
  cmd->callback([args, exit_code] { *exit_code = Run(*args); });
}

}  // namespace tandem::cli
