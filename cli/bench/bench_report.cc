#include "cli/bench/bench_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace tandem::cli {
namespace {

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - lo) * (sorted[hi] - sorted[lo]);
}

}  // namespace

LatencySummary Summarize(std::vector<double> v) {
  LatencySummary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  s.median = Quantile(v, 0.5);
  s.p90 = Quantile(v, 0.9);
  s.p99 = Quantile(v, 0.99);
  s.max = v.back();
  return s;
}

nlohmann::json LatencySummary::ToJson() const {
  return {{"mean", mean}, {"median", median}, {"p90", p90}, {"p99", p99}, {"max", max}};
}

BenchReport Compute(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo) {
  BenchReport r;
  r.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e, cached, ttft_uncached;
  int good = 0;
  for (const RequestRecord& x : records) {
    if (!x.ok) {
      ++r.failed;
      if (r.sample_errors.size() < 5) r.sample_errors.push_back(x.error);
      ++r.errors_by_class[x.error_class.empty() ? "other" : x.error_class];
      continue;
    }
    ++r.completed;
    r.total_input_tokens += x.prompt_tokens;
    r.total_output_tokens += x.output_tokens;
    r.total_output_chunks += x.chunks;
    r.cached_input_tokens += x.cached_prompt_tokens;
    r.draft_tokens += x.draft_tokens;
    r.accepted_draft_tokens += x.accepted_draft_tokens;
    cached.push_back(x.cached_prompt_tokens);
    if (x.cached_prompt_tokens > 0) {
      ++r.requests_with_cached_tokens;
    } else {
      ttft_uncached.push_back(x.ttft_s * 1e3);
    }
    ttft.push_back(x.ttft_s * 1e3);
    e2e.push_back(x.e2e_s * 1e3);
    double request_tpot = 0;
    if (x.output_tokens > 1) {
      request_tpot = (x.e2e_s - x.ttft_s) * 1e3 / (x.output_tokens - 1);
      tpot.push_back(request_tpot);
    }
    for (double g : x.itl_s) itl.push_back(g * 1e3);
    const bool ttft_ok = slo.ttft_ms <= 0 || x.ttft_s * 1e3 <= slo.ttft_ms;
    const bool tpot_ok = slo.tpot_ms <= 0 || request_tpot <= slo.tpot_ms;
    if (ttft_ok && tpot_ok) ++good;
  }
  if (duration_s > 0) {
    r.request_throughput = r.completed / duration_s;
    r.output_throughput = r.total_output_tokens / duration_s;
    r.total_token_throughput = (r.total_input_tokens + r.total_output_tokens) / duration_s;
    r.goodput = good / duration_s;
  }
  if (r.draft_tokens > 0) r.draft_acceptance_rate = static_cast<double>(r.accepted_draft_tokens) / r.draft_tokens;
  r.ttft_ms = Summarize(ttft);
  r.cached_tokens_per_request = Summarize(cached);
  r.ttft_uncached_ms = Summarize(ttft_uncached);
  r.tpot_ms = Summarize(tpot);
  r.itl_ms = Summarize(itl);
  r.e2e_ms = Summarize(e2e);
  return r;
}

nlohmann::json BenchReport::ToJson() const {
  nlohmann::json j = {{"completed", completed},
                      {"failed", failed},
                      {"duration_s", duration_s},
                      {"total_input_tokens", total_input_tokens},
                      {"total_output_tokens", total_output_tokens},
                      {"cached_input_tokens", cached_input_tokens},
                      {"request_throughput", request_throughput},
                      {"output_throughput", output_throughput},
                      {"total_token_throughput", total_token_throughput},
                      {"goodput", goodput},
                      {"ttft_ms", ttft_ms.ToJson()},
                      {"requests_with_cached_tokens", requests_with_cached_tokens},
                      {"cached_tokens_per_request", cached_tokens_per_request.ToJson()},
                      {"ttft_uncached_ms", ttft_uncached_ms.ToJson()},
                      {"tpot_ms", tpot_ms.ToJson()},
                      {"itl_ms", itl_ms.ToJson()},
                      {"e2e_latency_ms", e2e_ms.ToJson()},
                      {"total_output_chunks", total_output_chunks},
                      {"errors_by_class", errors_by_class},
                      {"sample_errors", sample_errors}};
  if (draft_tokens > 0) {
    j["draft_tokens"] = draft_tokens;
    j["accepted_draft_tokens"] = accepted_draft_tokens;
    j["draft_acceptance_rate"] = draft_acceptance_rate;
  }
  return j;
}

std::string BenchReport::ToText() const {
  std::string out;
  char line[256];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(line, sizeof line, "%-40s %s\n", name, value.c_str());
    out += line;
  };
  auto num = [](double v, int digits = 2) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return std::string(b);
  };
  out += "============ Serving Benchmark Result ============\n";
  row("Successful requests:", std::to_string(completed));
  row("Failed requests:", std::to_string(failed));
  row("Benchmark duration (s):", num(duration_s));
  row("Total input tokens:", std::to_string(total_input_tokens));
  row("Total input tokens from prefix cache:", std::to_string(cached_input_tokens));
  row("Total generated tokens:", std::to_string(total_output_tokens));
  row("Request throughput (req/s):", num(request_throughput));
  row("Request goodput (req/s):", num(goodput));
  row("Output token throughput (tok/s):", num(output_throughput));
  row("Total token throughput (tok/s):", num(total_token_throughput));
  auto section = [&](const char* title, const char* key, const LatencySummary& s) {
    std::snprintf(line, sizeof line, "%s\n", title);
    out += line;
    row((std::string("Mean ") + key + " (ms):").c_str(), num(s.mean));
    row((std::string("Median ") + key + " (ms):").c_str(), num(s.median));
    row((std::string("P90 ") + key + " (ms):").c_str(), num(s.p90));
    row((std::string("P99 ") + key + " (ms):").c_str(), num(s.p99));
  };
  section("---------------Time to First Token----------------", "TTFT", ttft_ms);
  // What the TTFT above includes: requests whose prompt was partly or wholly cached.
  row("Requests with cached prompt tokens:", std::to_string(requests_with_cached_tokens) + " of " +
                                                 std::to_string(completed));
  row("Mean cached prompt tokens per request:", num(cached_tokens_per_request.mean, 1));
  row("Max cached prompt tokens per request:", num(cached_tokens_per_request.max, 0));
  row("Median TTFT, requests with none (ms):",
      requests_with_cached_tokens < completed ? num(ttft_uncached_ms.median) : "-");
  if (draft_tokens > 0) {
    out += "--------------Speculative Decoding----------------\n";
    row("Draft tokens verified:", std::to_string(draft_tokens));
    row("Draft tokens accepted:", std::to_string(accepted_draft_tokens));
    row("Draft acceptance rate (%):", num(100 * draft_acceptance_rate));
  }
  section("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot_ms);
  section("---------------Inter-token Latency----------------", "ITL", itl_ms);
  section("----------------End-to-end Latency----------------", "E2EL", e2e_ms);
  out += "==================================================\n";
  for (const auto& [error_class, count] : errors_by_class) {
    out += "failed (" + error_class + "): " + std::to_string(count) + "\n";
  }
  for (const std::string& e : sample_errors) out += "error: " + e + "\n";
  return out;
}

}  // namespace tandem::cli
