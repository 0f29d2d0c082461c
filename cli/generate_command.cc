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

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "engine/model/rank_group_backend.h"
#include "engine/runtime/engine.h"
#include "engine/model/model_resolver.h"
#include "cli/client_security.h"
#include "cli/validators.h"
#ifdef TANDEM_WITH_SERVICES
#include "cli/remote_client.h"
#endif
#include "engine/tokenizer/tokenizer.h"
#include "engine/util/mapped_file.h"
#include "engine/util/status_macros.h"

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
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string json_schema, regex, grammar;
  bool json_object = false;
  bool compact_json = false;
  int grammar_compile_timeout_ms = 5000;
  int grammar_mask_threads = 0;
  bool batch_invariant = false;
  bool fp8_decode = false;
  bool fp8_prefill = false;
  int speculative_tokens = 0;
  double speculative_min_confidence = 0.0;
  bool no_speculative_adaptive = false;
  ClientSecurityArgs security;
  int threads = 0;
  int data_parallel = 1, expert_parallel = 1, tensor_parallel = 1;
  std::string device = "cpu";
  double gpu_memory_utilization = 0.9;
  double timeout_s = 0;
  bool model_set = false;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

const char* FinishName(const RequestOutput& o) {
  if (!o.status.ok()) return "error";
  switch (o.finish_reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: return "none";
  }
  return "?";
}

// The structured-output flags as one constraint (at most one kind); `@PATH` reads a file.
absl::StatusOr<OutputConstraint> ConstraintOf(const GenerateArgs& a) {
  OutputConstraint c;
  int kinds = 0;
  auto text = [](const std::string& v) -> absl::StatusOr<std::string> {
    if (!v.empty() && v[0] == '@') return ReadFileToString(v.substr(1));
    return v;
  };
  if (!a.json_schema.empty()) {
    ++kinds;
    c.kind = OutputConstraint::Kind::kJsonSchema;
    ASSIGN_OR_RETURN(c.text, text(a.json_schema));
  }
  if (!a.regex.empty()) {
    ++kinds;
    c.kind = OutputConstraint::Kind::kRegex;
    c.text = a.regex;
  }
  if (!a.grammar.empty()) {
    ++kinds;
    c.kind = OutputConstraint::Kind::kEbnf;
    ASSIGN_OR_RETURN(c.text, text(a.grammar));
  }
  if (a.json_object) {
    ++kinds;
    c.kind = OutputConstraint::Kind::kJsonObject;
  }
  if (kinds > 1) return absl::InvalidArgumentError("--json-schema, --regex, --grammar and --json-object exclude each other");
  if (a.compact_json) {
    if (c.kind != OutputConstraint::Kind::kJsonSchema && c.kind != OutputConstraint::Kind::kJsonObject) {
      return absl::InvalidArgumentError("--compact-json needs --json-schema or --json-object");
    }
    c.json.whitespace = grammar::JsonSchemaOptions::Whitespace::kCompact;
  }
  RETURN_IF_ERROR(Validate(c));
  return c;
}

int RunLocal(const GenerateArgs& a) {
  absl::StatusOr<OutputConstraint> constraint = ConstraintOf(a);
  if (!constraint.ok()) return Fail(constraint.status());
  absl::StatusOr<std::string> dir = ResolveModelDir(a.model);
  if (!dir.ok()) return Fail(dir.status());
  const auto t_load = std::chrono::steady_clock::now();
  EngineOptions options;
  options.num_threads = a.threads;
  options.device = a.device;
  options.gpu_memory_utilization = a.gpu_memory_utilization;
  options.grammar_compile_timeout_s = a.grammar_compile_timeout_ms / 1000.0;
  options.grammar_mask_threads = a.grammar_mask_threads;
  options.batch_invariant = a.batch_invariant;
  options.fp8_decode = a.fp8_decode;
  options.fp8_prefill = a.fp8_prefill;
  options.speculative_tokens = a.speculative_tokens;
  options.speculative_min_confidence = static_cast<float>(a.speculative_min_confidence);
  options.speculative_adaptive = !a.no_speculative_adaptive;
  // Ranks (docs/parallel.md) are forked first, before anything starts a thread; rank 0's
  // backend, this process's, goes to the engine.
  const RankGroupOptions ranks{.data_parallel = a.data_parallel, .expert_parallel = a.expert_parallel,
                               .tensor_parallel = a.tensor_parallel,
                               .name = absl::StrCat("generate-", ::getpid()),
                               .kv_cache_bytes = options.kv_cache_bytes};
  const BackendOptions backend{.device = a.device, .num_threads = a.threads, .mtp = a.speculative_tokens > 0};
  absl::StatusOr<int> world = RankGroupWorld(ranks, backend);
  if (!world.ok()) return Fail(world.status());
  if (*world > 1) {
    absl::StatusOr<std::unique_ptr<ModelBackend>> group = StartCpuRankGroup(*dir, backend, ranks);
    if (!group.ok()) return Fail(group.status());
    auto holder = std::make_shared<std::unique_ptr<ModelBackend>>(*std::move(group));
    options.backend_factory = [holder](const std::string&) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      if (*holder == nullptr) return absl::FailedPreconditionError("the rank group's backend was taken already");
      return std::move(*holder);
    };
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*dir, options);
  if (!engine.ok()) return Fail(engine.status());
  std::fprintf(stderr, "model %s (%s), loaded in %.2f s\n", dir->c_str(), (*engine)->config().summary.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());

  EngineRequest request;
  request.id = "generate-local";
  absl::StatusOr<std::vector<int32_t>> prompt = (*engine)->tokenizer().TryEncode(a.prompt, /*add_special_tokens=*/true);
  if (!prompt.ok()) return Fail(prompt.status());
  request.prompt = *std::move(prompt);
  request.sampling.temperature = static_cast<float>(a.temperature);
  request.sampling.top_p = static_cast<float>(a.top_p);
  request.sampling.top_k = a.top_k;
  request.sampling.min_p = static_cast<float>(a.min_p);
  request.sampling.repetition_penalty = static_cast<float>(a.repetition_penalty);
  request.sampling.presence_penalty = static_cast<float>(a.presence_penalty);
  request.sampling.frequency_penalty = static_cast<float>(a.frequency_penalty);
  if (a.seed >= 0) request.sampling.seed = static_cast<uint64_t>(a.seed);
  request.stop.max_tokens = a.max_tokens;
  request.stop.stop = a.stop;
  request.stop.ignore_eos = a.ignore_eos;
  request.constraint = *std::move(constraint);
  absl::StatusOr<std::shared_ptr<OutputStream>> stream = (*engine)->Submit(std::move(request));
  if (!stream.ok()) return Fail(stream.status());
  RequestOutput out;
  RequestOutput last;
  while ((*stream)->Next(&out)) {
    std::fwrite(out.text.data(), 1, out.text.size(), stdout);
    std::fflush(stdout);
    if (out.finished) last = std::move(out);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!last.status.ok()) return Fail(last.status);
  const RequestMetrics& m = last.metrics;
  const double decode_s = m.e2e_s - m.ttft_s;
  std::fprintf(stderr,
               "finish: %s | prompt tokens: %d (cached %d) | generated tokens: %d | TTFT: %.1f ms | "
               "decode: %.1f tokens/s",
               FinishName(last), m.prompt_tokens, m.cached_prompt_tokens, m.completion_tokens, m.ttft_s * 1e3,
               m.completion_tokens > 1 && decode_s > 0 ? (m.completion_tokens - 1) / decode_s : 0.0);
  if (m.draft_tokens > 0) {
    std::fprintf(stderr, " | drafts accepted: %d of %d (%.1f%%)", m.accepted_draft_tokens, m.draft_tokens,
                 100.0 * m.accepted_draft_tokens / m.draft_tokens);
  }
  std::fputc('\n', stderr);
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text for a prompt, streaming it to stdout "
                                                  "(usage and timings go to stderr).");
  cmd->add_option("prompt", args->prompt, "The prompt text")->required();
  cmd->add_flag("--local", args->local, "Run the engine in this process instead of calling a server");
  cmd->add_option("--addr", args->addr, "Router address HOST:PORT (default 127.0.0.1:50051, serve-local's)")
      ->envname("TANDEM_ADDR");
  CLI::Option* model_opt = cmd->add_option("--model", args->model,
                                           "Checkpoint directory or built-in model (tiny, tiny-v2); with --addr, "
                                           "the served model's name (default: whatever the server serves)")
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
  cmd->add_option("--min-p", args->min_p, "Drop tokens below this fraction of the most likely one's probability")
      ->check(FiniteRange(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", args->repetition_penalty,
                  "Penalty for tokens already in the prompt or output (1 = off)")
      ->check(FiniteRange(0.01, 10.0))
      ->capture_default_str();
  cmd->add_option("--presence-penalty", args->presence_penalty, "Subtracted from logits of tokens already generated")
      ->check(FiniteRange(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", args->frequency_penalty,
                  "Subtracted from a token's logit per occurrence in the output")
      ->check(FiniteRange(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed (default: random)");
  cmd->add_option("--stop", args->stop, "Stop string (repeatable); not included in the output");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past the end-of-sequence token");
  cmd->add_option("--json-schema", args->json_schema,
                  "Structured output: the text must be JSON valid under this schema (inline, or @FILE)");
  cmd->add_option("--regex", args->regex, "Structured output: the text must match this regex in full (Python syntax)");
  cmd->add_option("--grammar", args->grammar,
                  "Structured output: the text must be a sentence of this EBNF grammar, from rule 'root' (inline, "
                  "or @FILE)");
  cmd->add_flag("--json-object", args->json_object, "Structured output: the text must be a JSON object");
  cmd->add_flag("--compact-json", args->compact_json,
                "With --json-schema / --json-object: no spaces after ',' and ':' (default: as json.dumps)");
  cmd->add_option("--grammar-compile-timeout-ms", args->grammar_compile_timeout_ms,
                  "--local: a constraint that takes longer to compile is refused")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--grammar-mask-threads", args->grammar_mask_threads,
                  "--local on a GPU: threads that fill the token masks while the GPU runs a step (0: a quarter of the "
                  "hardware threads, 1 to 8)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_flag("--batch-invariant", args->batch_invariant,
                "--local: logits bitwise independent of batching and prefill chunking (docs/batch-invariance.md); "
                "for a cluster, start its workers with --batch-invariant");
  cmd->add_flag("--fp8-decode", args->fp8_decode,
                "--local --device cuda, an FP8 DeepSeek-V2/V3 checkpoint: decode steps on its stored FP8 weights "
                "(1.5x the bf16 weight memory); for a cluster, start its workers with --fp8-decode");
  cmd->add_flag("--fp8-prefill", args->fp8_prefill,
                "--local --device cuda (Hopper), an FP8 DeepSeek checkpoint: passes of 128+ tokens multiply on the "
                "FP8 tensor cores; for a cluster, start its workers with --fp8-prefill");
  cmd->add_option("--speculative-tokens", args->speculative_tokens,
                  "--local: speculative decoding with the model's MTP layer, up to N drafts per step (0 = off; "
                  "docs/speculative-decoding.md); for a cluster, start its workers with --speculative-tokens")
      ->check(CLI::Range(0, static_cast<int>(kMaxSpeculativeTokens)))
      ->capture_default_str();
  cmd->add_option("--speculative-min-confidence", args->speculative_min_confidence,
                  "--local with --speculative-tokens: stop drafting at a draft the MTP layer gives a probability "
                  "below this")
      ->check(FiniteRange(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--no-speculative-adaptive", args->no_speculative_adaptive,
                "--local with --speculative-tokens: draft at every step (default: only where drafting measured "
                "faster; the text is the same either way)");
  cmd->add_option("--threads", args->threads, "CPU threads (0 = all; with ranks, per rank: 0 = all / ranks)")
      ->capture_default_str();
  cmd->add_option("--expert-parallel", args->expert_parallel,
                  "--local, cpu: run the model on N ranks (processes of this machine), each holding 1/N of every "
                  "MoE layer's routed experts; tokens go to their experts' ranks and back (docs/parallel.md). "
                  "Outputs are bitwise one rank's")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--tensor-parallel", args->tensor_parallel,
                  "--local, cpu: run the model on N ranks, each holding 1/N of the LM head's vocabulary rows and "
                  "of the dense MLPs' rows; with --expert-parallel the same N (one group of ranks)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--data-parallel", args->data_parallel,
                  "--local, cpu: data-parallel attention on N ranks: each sequence runs on one rank, whose own KV "
                  "pool holds it (rank 0 places it and gathers the logits); with --expert-parallel the same N. "
                  "Not with --tensor-parallel. Outputs are bitwise one rank's")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--device", args->device, "--local: where the model runs: cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                  "--local with cuda: fraction of the GPU's memory for weights, activations and KV cache")
      ->check(CLI::Range(0.05, 0.99))
      ->capture_default_str();
  cmd->add_option("--timeout", args->timeout_s, "Deadline of a remote request, seconds (0 = none)")
      ->check(FiniteRange(0.0, 86400.0));
  AddClientSecurityFlags(cmd, &args->security, /*internal=*/false);
  cmd->callback([args, exit_code, model_opt] {
    args->model_set = model_opt->count() > 0;
    if (args->local) {
      *exit_code = RunLocal(*args);
      return;
    }
    if (args->data_parallel > 1 || args->expert_parallel > 1 || args->tensor_parallel > 1) {
      *exit_code = Fail(absl::InvalidArgumentError(
          "--data-parallel, --expert-parallel and --tensor-parallel need --local: for a cluster, start its workers "
          "with them (docs/parallel.md)"));
      return;
    }
    if (args->fp8_decode || args->fp8_prefill) {
      const char* flag = args->fp8_decode ? "--fp8-decode" : "--fp8-prefill";
      *exit_code = Fail(absl::InvalidArgumentError(absl::StrCat(
          flag, " needs --local: for a cluster, start its workers with ", flag, " (tandem serve-local ", flag, ")")));
      return;
    }
    if (args->batch_invariant) {
      *exit_code = Fail(absl::InvalidArgumentError(
          "--batch-invariant needs --local: a cluster computes batch-invariantly when its workers are started "
          "with --batch-invariant (tandem serve-local --batch-invariant)"));
      return;
    }
    if (args->speculative_tokens > 0 || args->speculative_min_confidence > 0 || args->no_speculative_adaptive) {
      *exit_code = Fail(absl::InvalidArgumentError(
          "--speculative-tokens, --speculative-min-confidence and --no-speculative-adaptive need --local: a cluster "
          "drafts when its workers are started with --speculative-tokens (tandem serve-local --speculative-tokens N)"));
      return;
    }
#ifdef TANDEM_WITH_SERVICES
    absl::StatusOr<OutputConstraint> constraint = ConstraintOf(*args);
    if (!constraint.ok()) {
      *exit_code = Fail(constraint.status());
      return;
    }
    RemoteGenerateArgs r{.addr = args->addr.empty() ? "127.0.0.1:50051" : args->addr,
                         .model = args->model_set ? args->model : "",
                         .prompt = args->prompt, .max_tokens = args->max_tokens, .temperature = args->temperature,
                         .top_p = args->top_p, .top_k = args->top_k, .min_p = args->min_p,
                         .repetition_penalty = args->repetition_penalty, .presence_penalty = args->presence_penalty,
                         .frequency_penalty = args->frequency_penalty, .seed = args->seed, .stop = args->stop,
                         .ignore_eos = args->ignore_eos, .constraint = *std::move(constraint), .timeout_s = args->timeout_s,
                         .security = args->security};
    *exit_code = RunRemoteGenerate(r);
#else
    std::fprintf(stderr, "tandem generate: this build has no services (TANDEM_ENGINE_ONLY); use --local\n");
    *exit_code = 2;
#endif
  });
}

}  // namespace tandem::cli
