#include "cli/bench_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/bench/grpc_backend.h"
#include "cli/bench/http_client.h"
#include "cli/bench/load_generator.h"
#include "cli/bench/openai_backend.h"
#include "cli/validators.h"

namespace tandem::cli {
namespace {

struct BenchArgs {
  LoadOptions load;
  RequestSettings settings;
  std::string addr = "127.0.0.1:50051";
  ClientSecurityArgs security;
  std::string backend = "grpc";
  std::string base_url;
  std::string compare_backends;
  int compare_rounds = 10;
  std::string request_rate = "inf";
  std::string slo;
  std::string json;
  bool no_progress = false;
};

constexpr const char* kBackends[] = {"grpc", "openai-completions", "openai-chat"};

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

// The backends to run, in order: --compare-backends, else --backend.
bool ParseBackends(const BenchArgs& a, std::vector<std::string>* names, std::string* error) {
  if (a.compare_backends.empty()) {
    names->push_back(a.backend);
  } else {
    for (absl::string_view part : absl::StrSplit(a.compare_backends, ',', absl::SkipEmpty())) {
      names->emplace_back(absl::StripAsciiWhitespace(part));
    }
    if (names->size() < 2) {
      *error = "--compare-backends: at least two backends, e.g. grpc,openai-completions";
      return false;
    }
  }
  for (size_t i = 0; i < names->size(); ++i) {
    const std::string& n = (*names)[i];
    if (std::find(std::begin(kBackends), std::end(kBackends), n) == std::end(kBackends)) {
      *error = "unknown backend '" + n + "' (grpc, openai-completions, openai-chat)";
      return false;
    }
    if (std::find(names->begin(), names->begin() + i, n) != names->begin() + i) {
      *error = "--compare-backends: '" + n + "' given twice";
      return false;
    }
    if (n != "grpc" && a.base_url.empty()) {
      *error = "backend " + n + " needs --base-url (e.g. http://127.0.0.1:8000/v1, which serve-local prints)";
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<BenchBackend>> MakeBackend(const std::string& name, const BenchArgs& a) {
  if (name == "grpc") return MakeGrpcBackend(a.addr, a.security, a.settings);
  absl::StatusOr<HttpBaseUrl> url = ParseHttpBaseUrl(a.base_url);
  if (!url.ok()) return url.status();
  OpenAiBackendOptions o;
  o.base_url = *url;
  o.endpoint = name == "openai-chat" ? OpenAiEndpoint::kChat : OpenAiEndpoint::kCompletions;
  o.api_key = a.security.api_key;
  o.settings = a.settings;
  return MakeOpenAiBackend(std::move(o));
}

// Each backend against the first (the baseline): TTFT, ITL and end-to-end medians, their
// differences and ratios, and TTFT's difference round by round (the rounds alternate the
// order, so drift falls on both).
nlohmann::json Comparison(const std::vector<LoadResult>& results, const std::vector<BenchReport>& reports) {
  nlohmann::json out = nlohmann::json::array();
  const BenchReport& base = reports.front();
  auto ratio = [](double x, double y) { return y > 0 ? nlohmann::json(x / y) : nlohmann::json(nullptr); };
  for (size_t b = 1; b < reports.size(); ++b) {
    const BenchReport& r = reports[b];
    std::vector<double> diffs;
    for (size_t i = 0; i < results[b].round_ttft_p50_ms.size() && i < results[0].round_ttft_p50_ms.size(); ++i) {
      diffs.push_back(results[b].round_ttft_p50_ms[i] - results[0].round_ttft_p50_ms[i]);
    }
    out.push_back({{"backend", results[b].backend},
                   {"baseline", results[0].backend},
                   {"ttft_p50_ms", r.ttft_ms.median},
                   {"baseline_ttft_p50_ms", base.ttft_ms.median},
                   {"ttft_p50_diff_ms", r.ttft_ms.median - base.ttft_ms.median},
                   {"ttft_p50_ratio", ratio(r.ttft_ms.median, base.ttft_ms.median)},
                   {"ttft_mean_diff_ms", r.ttft_ms.mean - base.ttft_ms.mean},
                   {"itl_p50_diff_ms", r.itl_ms.median - base.itl_ms.median},
                   {"e2e_p50_diff_ms", r.e2e_ms.median - base.e2e_ms.median},
                   {"e2e_p50_ratio", ratio(r.e2e_ms.median, base.e2e_ms.median)},
                   {"round_ttft_p50_ms", results[b].round_ttft_p50_ms},
                   {"baseline_round_ttft_p50_ms", results[0].round_ttft_p50_ms},
                   {"round_ttft_p50_diff_ms", diffs},
                   {"round_ttft_p50_diff_median_ms", Summarize(diffs).median}});
  }
  return out;
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
  std::vector<std::string> names;
  if (!ParseBackends(a, &names, &error)) {
    std::fprintf(stderr, "tandem bench: %s\n", error.c_str());
    return 2;
  }
  std::vector<std::unique_ptr<BenchBackend>> backends;
  std::vector<BenchBackend*> raw;
  for (const std::string& n : names) {
    absl::StatusOr<std::unique_ptr<BenchBackend>> b = MakeBackend(n, a);
    if (!b.ok()) {
      std::fprintf(stderr, "tandem bench: %s\n", std::string(b.status().message()).c_str());
      return 2;
    }
    raw.push_back(b->get());
    backends.push_back(std::move(*b));
  }
  const bool compare = names.size() > 1;
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
  const bool any_grpc = std::find(names.begin(), names.end(), "grpc") != names.end();
  const bool any_http = std::any_of(names.begin(), names.end(), [](const std::string& n) { return n != "grpc"; });
  std::string where = any_grpc ? a.addr : "";
  if (any_http) where += (where.empty() ? "" : " and ") + a.base_url;
  std::fprintf(stderr,
               "tandem bench: %d requests%s through %s to %s, rate %s, max concurrency %s, input %d, output %d ...\n",
               a.load.dataset.num_prompts, compare ? " each" : "", absl::StrJoin(names, ", ").c_str(), where.c_str(),
               a.request_rate.c_str(),
               a.load.max_concurrency > 0 ? std::to_string(a.load.max_concurrency).c_str() : "unbounded",
               a.load.dataset.input_len, a.load.dataset.output_len);
  absl::StatusOr<std::vector<LoadResult>> results = RunCompare(raw, a.load, compare ? a.compare_rounds : 1);
  if (!results.ok()) {
    std::fprintf(stderr, "tandem bench: %s\n", std::string(results.status().message()).c_str());
    return 1;
  }
  std::vector<BenchReport> reports;
  int failed = 0;
  for (const LoadResult& r : *results) {
    reports.push_back(Compute(r.records, r.duration_s, slo));
    failed += reports.back().failed;
    if (compare) std::printf("Backend: %s\n", r.backend.c_str());
    std::printf("%s", reports.back().ToText().c_str());
  }
  nlohmann::json comparison;
  if (compare) {
    comparison = Comparison(*results, reports);
    std::printf("============ Backends compared (%d rounds) ============\n", std::min(a.compare_rounds, a.load.dataset.num_prompts));
    for (const nlohmann::json& c : comparison) {
      std::printf("%-40s %.3f - %.3f = %.3f ms (ratio %.3f)\n",
                  ("Median TTFT, " + c["backend"].get<std::string>() + " - " + c["baseline"].get<std::string>() + ":")
                      .c_str(),
                  c["ttft_p50_ms"].get<double>(), c["baseline_ttft_p50_ms"].get<double>(),
                  c["ttft_p50_diff_ms"].get<double>(), c["ttft_p50_ratio"].is_number() ? c["ttft_p50_ratio"].get<double>() : 0.0);
      std::printf("%-40s %.3f ms\n", "Median of the rounds' TTFT differences:", c["round_ttft_p50_diff_median_ms"].get<double>());
    }
  }
  if (!a.json.empty()) {
    const DatasetOptions& d = a.load.dataset;
    nlohmann::json config = {{"num_prompts", d.num_prompts}, {"request_rate", a.request_rate},
                             {"max_concurrency", a.load.max_concurrency}, {"input_len", d.input_len},
                             {"output_len", d.output_len}, {"range_ratio", d.range_ratio},
                             {"prefix_len", d.prefix_len}, {"num_prefixes", d.num_prefixes},
                             {"ignore_eos", a.settings.ignore_eos}, {"temperature", a.settings.temperature},
                             {"seed", d.seed}, {"num_warmup", d.num_warmup},
                             {"slo", {{"ttft_ms", slo.ttft_ms}, {"tpot_ms", slo.tpot_ms}}}};
    nlohmann::json j = {{"benchmark", compare ? "serving-compare" : "serving"}, {"model", results->front().model}};
    if (any_grpc) j["addr"] = a.addr;
    if (any_http) j["base_url"] = a.base_url;
    auto result_json = [&](size_t b) {
      nlohmann::json r = reports[b].ToJson();
      if (!(*results)[b].transport.is_null()) r["transport"] = (*results)[b].transport;
      return r;
    };
    if (compare) {
      config["compare_rounds"] = std::min(a.compare_rounds, d.num_prompts);
      j["backends"] = names;
      j["results"] = nlohmann::json::object();
      for (size_t b = 0; b < names.size(); ++b) j["results"][names[b]] = result_json(b);
      j["comparison"] = comparison;
    } else {
      j["backend"] = names.front();
      j["result"] = result_json(0);
    }
    j["config"] = config;
    std::ofstream out(a.json);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "tandem bench: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Serving benchmark in the style of `vllm bench serve`: TTFT, TPOT, ITL, end-to-end latency, "
               "throughput and goodput of streaming requests against a running cluster, through gRPC or the "
               "OpenAI-compatible HTTP API, or through several of them in one run to compare them.");
  cmd->add_option("--backend", a->backend,
                  "How requests are sent: grpc (tandem.v1 Generate), openai-completions (POST /v1/completions with "
                  "the prompt's token ids) or openai-chat (POST /v1/chat/completions with its text); all streamed")
      ->check(CLI::IsMember({"grpc", "openai-completions", "openai-chat"}))
      ->capture_default_str();
  cmd->add_option("--addr", a->addr, "Router (or worker) gRPC address HOST:PORT (backend grpc)")->envname("TANDEM_ADDR")->capture_default_str();
  cmd->add_option("--base-url", a->base_url,
                  "The OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (what serve-local prints as http; the "
                  "openai backends)");
  cmd->add_option("--compare-backends", a->compare_backends,
                  "Run the same load through each of these backends, e.g. grpc,openai-completions (--num-prompts "
                  "each, prompts of their own of the same shape), alternating in rounds, and report each one's "
                  "figures and their TTFT, ITL and end-to-end medians against the first")
      ->excludes(cmd->get_option("--backend"));
  cmd->add_option("--compare-rounds", a->compare_rounds,
                  "Rounds of --compare-backends: round i sends the i-th share of the prompts through every backend, "
                  "in order on even rounds and reversed on odd ones")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--model", a->settings.model, "Model name (default: the served one)");
  cmd->add_option("--num-prompts", a->load.dataset.num_prompts, "Requests to send")->check(CLI::Range(1, 10000000))->capture_default_str();
  cmd->add_option("--request-rate", a->request_rate, "Poisson arrival rate in requests/s, or inf (all at once)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", a->load.max_concurrency, "Most requests in flight (0 = unbounded)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--input-len", a->load.dataset.input_len, "Random prompt tokens per request (after any shared prefix)")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--output-len", a->load.dataset.output_len, "max_tokens per request")->check(CLI::Range(1, 10000000))->capture_default_str();
  cmd->add_option("--range-ratio", a->load.dataset.range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->check(FiniteRange(0.0, 0.999))
      ->capture_default_str();
  cmd->add_option("--prefix-len", a->load.dataset.prefix_len, "Shared-prefix dataset: tokens of the prefix each prompt starts with")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--num-prefixes", a->load.dataset.num_prefixes, "Distinct shared prefixes")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--vocab-size", a->load.vocab_size,
                  "Vocabulary the random prompt tokens are drawn from (0 = the server's: gRPC ListModels says it, the "
                  "openai backends learn it from /detokenize)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", a->settings.ignore_eos, "Generate exactly --output-len tokens");
  cmd->add_option("--temperature", a->settings.temperature, "Sampling temperature (0 = greedy)")
      ->check(FiniteRange(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--seed", a->load.dataset.seed, "Seed of the dataset and of each request's sampling")->capture_default_str();
  cmd->add_option("--num-warmup", a->load.dataset.num_warmup, "Requests sent (one at a time, per backend) before measuring, with prompts of their own that no measured "
                  "request shares (so no measured request is a cache hit on a warm-up)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--request-timeout", a->settings.timeout_s, "Deadline per request, seconds")
      ->check(FiniteRange(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--slo", a->slo, "Goodput SLOs, e.g. ttft:500,tpot:50 (milliseconds)");
  cmd->add_option("--json", a->json, "Write the configuration and every figure to this JSON file");
  cmd->add_flag("--no-progress", a->no_progress, "No progress display on stderr");
  // Against the router: --tls-ca and --api-key (the openai backends send the key as
  // Authorization: Bearer, and speak plain http only); against a worker's internal port:
  // its client certificate or the cluster token.
  AddClientSecurityFlags(cmd, &a->security, /*internal=*/true);
  cmd->callback([a, exit_code] { *exit_code = Run(*a); });
}

}  // namespace tandem::cli
