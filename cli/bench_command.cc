#include "cli/bench_command.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/bench/load_generator.h"
#include "cli/validators.h"

namespace tandem::cli {
namespace {

struct BenchArgs {
  LoadOptions load;
  std::string request_rate = "inf";
  std::string slo;
  std::string json;
  bool no_progress = false;
};

// "ttft:500,tpot:50" -> Slo.
bool ParseSlo(const std::string& text, Slo* slo, std::string* error) {
  if (text.empty()) return true;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    double ms = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0) || !std::isfinite(ms)) {
      *error = "--slo: expected ttft:MS,tpot:MS with positive numbers, got '" + std::string(part) + "'";
      return false;
    }
    if (kv[0] == "ttft") slo->ttft_ms = ms;
    else if (kv[0] == "tpot") slo->tpot_ms = ms;
    else {
      *error = "--slo: unknown metric '" + kv[0] + "' (ttft, tpot)";
      return false;
    }
  }
  return true;
}

int Run(BenchArgs& a) {
  if (a.request_rate == "inf" || a.request_rate == "Inf") {
    a.load.request_rate = 0;
  } else if (!absl::SimpleAtod(a.request_rate, &a.load.request_rate) || !(a.load.request_rate > 0) ||
             !std::isfinite(a.load.request_rate)) {
    std::fprintf(stderr, "tandem bench: --request-rate: a positive number or inf, got '%s'\n", a.request_rate.c_str());
    return 2;
  }
  Slo slo;
  std::string error;
  if (!ParseSlo(a.slo, &slo, &error)) {
    std::fprintf(stderr, "tandem bench: %s\n", error.c_str());
    return 2;
  }
  const bool tty = ::isatty(2) != 0;
  if (!a.no_progress) {
    auto last_pct = std::make_shared<int>(-1);
    a.load.progress = [tty, last_pct](int done, int failed, int total) {
      const int pct = 100 * done / total;
      if (tty) {
        const int width = 40, filled = width * done / total;
        std::fprintf(stderr, "\r[%s%s] %d/%d requests (%d failed)", std::string(filled, '=').c_str(),
                     std::string(width - filled, ' ').c_str(), done, total, failed);
        if (done == total) std::fputc('\n', stderr);
      } else if (pct / 10 != *last_pct) {
        *last_pct = pct / 10;
        std::fprintf(stderr, "%3d%%  %d/%d requests (%d failed)\n", pct, done, total, failed);
      }
    };
  }
  std::fprintf(stderr, "tandem bench: %d requests to %s, rate %s, max concurrency %s, input %d, output %d ...\n",
               a.load.num_prompts, a.load.addr.c_str(), a.request_rate.c_str(),
               a.load.max_concurrency > 0 ? std::to_string(a.load.max_concurrency).c_str() : "unbounded",
               a.load.input_len, a.load.output_len);
  absl::StatusOr<LoadResult> result = RunLoad(a.load);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  const BenchReport report = Compute(result->records, result->duration_s, slo);
  std::printf("%s", report.ToText().c_str());
  if (!a.json.empty()) {
    nlohmann::json j = {{"benchmark", "serving"},
                        {"addr", a.load.addr},
                        {"model", result->model},
                        {"config",
                         {{"num_prompts", a.load.num_prompts}, {"request_rate", a.request_rate},
                          {"max_concurrency", a.load.max_concurrency}, {"input_len", a.load.input_len},
                          {"output_len", a.load.output_len}, {"range_ratio", a.load.range_ratio},
                          {"prefix_len", a.load.prefix_len}, {"num_prefixes", a.load.num_prefixes},
                          {"ignore_eos", a.load.ignore_eos}, {"temperature", a.load.temperature},
                          {"seed", a.load.seed}, {"slo", {{"ttft_ms", slo.ttft_ms}, {"tpot_ms", slo.tpot_ms}}}}},
                        {"result", report.ToJson()}};
    std::ofstream out(a.json);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "tandem bench: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return report.failed == 0 ? 0 : 1;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<BenchArgs>();
  a->load.addr = "127.0.0.1:50051";
  CLI::App* cmd = app.add_subcommand(
      "bench", "Serving benchmark in the style of `vllm bench serve`: TTFT, TPOT, ITL, end-to-end latency, "
               "throughput and goodput of streaming Generate calls against a running cluster.");
  cmd->add_option("--addr", a->load.addr, "Router (or worker) address HOST:PORT")->envname("TANDEM_ADDR")->capture_default_str();
  cmd->add_option("--model", a->load.model, "Model name (default: the served one)");
  cmd->add_option("--num-prompts", a->load.num_prompts, "Requests to send")->check(CLI::Range(1, 10000000))->capture_default_str();
  cmd->add_option("--request-rate", a->request_rate, "Poisson arrival rate in requests/s, or inf (all at once)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", a->load.max_concurrency, "Most requests in flight (0 = unbounded)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--input-len", a->load.input_len, "Random prompt tokens per request (after any shared prefix)")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--output-len", a->load.output_len, "max_tokens per request")->check(CLI::Range(1, 10000000))->capture_default_str();
  cmd->add_option("--range-ratio", a->load.range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->check(FiniteRange(0.0, 0.999))
      ->capture_default_str();
  cmd->add_option("--prefix-len", a->load.prefix_len, "Shared-prefix dataset: tokens of the prefix each prompt starts with")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--num-prefixes", a->load.num_prefixes, "Distinct shared prefixes")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_flag("--ignore-eos", a->load.ignore_eos, "Generate exactly --output-len tokens");
  cmd->add_option("--temperature", a->load.temperature, "Sampling temperature (0 = greedy)")
      ->check(FiniteRange(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--seed", a->load.seed, "Seed of the dataset and of each request's sampling")->capture_default_str();
  cmd->add_option("--num-warmup", a->load.num_warmup, "Requests sent (one at a time) before measuring, with prompts of their own that no measured "
                  "request shares (so no measured request is a cache hit on a warm-up)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--request-timeout", a->load.request_timeout_s, "Deadline per request, seconds")
      ->check(FiniteRange(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--slo", a->slo, "Goodput SLOs, e.g. ttft:500,tpot:50 (milliseconds)");
  cmd->add_option("--json", a->json, "Write the configuration and every figure to this JSON file");
  cmd->add_flag("--no-progress", a->no_progress, "No progress display on stderr");
  // Against the router: --tls-ca and --api-key; against a worker's internal port: its
  // client certificate or the cluster token.
  AddClientSecurityFlags(cmd, &a->load.security, /*internal=*/true);
  cmd->callback([a, exit_code] { *exit_code = Run(*a); });
}

}  // namespace tandem::cli
