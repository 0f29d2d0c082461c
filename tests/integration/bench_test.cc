// `tandem bench` as a user runs it against `tandem serve-local`: a full report on stdout
// and a JSON file with every figure. serve-local runs with its defaults, so its processes
// talk mutual TLS with a throwaway CA: `tandem status` with the credentials its ready file
// names works, without them it is refused, and the CA's directory is private and gone
// once serve-local stops.
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/subprocess.h"
#include "tests/unit/engine/model/test_models.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::BinaryPath;
using testing::RunProcess;
using testing::TempDir;

// Starts `tandem serve-local` (router, prefill, decode, kvstore on the tiny model) and
// returns the router's gRPC address, empty on failure; *http: its OpenAI-compatible API's.
std::string StartServeLocal(TempDir& tmp, std::unique_ptr<BackgroundProcess>* cluster, std::string* http = nullptr) {
  const std::string ready = tmp.Sub("ready.json");
  *cluster = std::make_unique<BackgroundProcess>(
      std::vector<std::string>{BinaryPath("tandem"), "serve-local", "--listen", "127.0.0.1:0", "--threads", "1",
                               "--ready-file", ready, "--run-dir", tmp.Sub("run")},
      tmp.Sub("serve-local.log"));
  if ((*cluster)->pid() <= 0) return "";
  for (int i = 0; i < 1200 && !std::filesystem::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!std::filesystem::exists(ready)) {
    ADD_FAILURE() << ReadFileToString(tmp.Sub("serve-local.log")).value_or("");
    return "";
  }
  const nlohmann::json r = nlohmann::json::parse(ReadFileToString(ready).value());
  if (http != nullptr) *http = r["router"].value("http", "");
  return r["router"].value("grpc", "");
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFileToString(path).value_or(""), nullptr, false);
}

TEST(BenchTest, ReportAndJsonAgainstServeLocal) {
  TempDir tmp;
  std::unique_ptr<BackgroundProcess> cluster_process;
  const std::string router = StartServeLocal(tmp, &cluster_process);
  ASSERT_FALSE(router.empty());
  BackgroundProcess& cluster = *cluster_process;

  const std::string json_file = tmp.Sub("bench.json");
  auto bench = RunProcess({BinaryPath("tandem"), "bench", "--addr", router, "--num-prompts", "24", "--request-rate",
                           "20", "--max-concurrency", "8", "--input-len", "48", "--output-len", "12",
                           "--range-ratio", "0.5", "--prefix-len", "64", "--num-prefixes", "2", "--ignore-eos",
                           "--slo", "ttft:5000,tpot:1000", "--json", json_file, "--no-progress"},
                          {}, 300);
  ASSERT_EQ(bench.exit_code, 0) << bench.out << bench.err;
  for (const char* line : {"Successful requests:", "Failed requests:", "Request throughput (req/s):",
                           "Request goodput (req/s):", "Output token throughput (tok/s):", "Mean TTFT (ms):",
                           "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):", "P90 ITL (ms):",
                           "P99 E2EL (ms):", "Total input tokens from prefix cache:",
                           "Requests with cached prompt tokens:", "Mean cached prompt tokens per request:",
                           "Median TTFT, requests with none (ms):"}) {
    EXPECT_NE(bench.out.find(line), std::string::npos) << line << "\n" << bench.out;
  }
  const nlohmann::json j = nlohmann::json::parse(ReadFileToString(json_file).value(), nullptr, false);
  ASSERT_TRUE(j.is_object()) << ReadFileToString(json_file).value_or("");
  // Every figure, whatever the nesting (configuration and results).
  const nlohmann::json flat = j.flatten();
  auto find = [&](const std::string& suffix) -> nlohmann::json {
    for (auto it = flat.begin(); it != flat.end(); ++it) {
      if (it.key().size() >= suffix.size() && it.key().compare(it.key().size() - suffix.size(), suffix.size(), suffix) == 0) {
        return *it;
      }
    }
    return nullptr;
  };
  EXPECT_EQ(find("/completed"), 24) << j.dump(2);
  EXPECT_EQ(find("/failed"), 0);
  // --range-ratio 0.5: each request asks for 6..18 tokens (--ignore-eos: it gets them).
  EXPECT_GE(find("/total_output_tokens").get<int64_t>(), 24 * 6);
  EXPECT_LE(find("/total_output_tokens").get<int64_t>(), 24 * 18);
  for (const char* key : {"/ttft_ms/p99", "/tpot_ms/median", "/itl_ms/p90", "/e2e_latency_ms/mean",
                          "/request_throughput", "/output_throughput", "/goodput"}) {
    const nlohmann::json v = find(key);
    ASSERT_TRUE(v.is_number()) << key << "\n" << j.dump(2);
    EXPECT_GT(v.get<double>(), 0) << key;
  }
  EXPECT_LE(find("/ttft_ms/median").get<double>(), find("/ttft_ms/p99").get<double>());
  EXPECT_GT(find("/cached_input_tokens").get<double>(), 0) << "shared prefixes should hit the prefix cache";
  EXPECT_GT(find("/requests_with_cached_tokens").get<int>(), 0);
  EXPECT_GT(find("/cached_tokens_per_request/max").get<double>(), 0);

  // Internal traffic is mutual TLS; the ready file says where the CA and a client
  // certificate are, and the router's internal address.
  const nlohmann::json r = nlohmann::json::parse(ReadFileToString(tmp.Sub("ready.json")).value());
  const nlohmann::json& sec = r["security"];
  EXPECT_EQ(sec.value("internal_auth", ""), "mutual TLS") << r.dump(2);
  EXPECT_EQ(r["router"].value("internal_auth", ""), "mutual TLS");
  const std::string internal = r.value("internal", "");
  ASSERT_FALSE(internal.empty()) << r.dump(2);
  const std::filesystem::path pki_dir = std::filesystem::path(sec.value("ca", "")).parent_path();
  ASSERT_TRUE(std::filesystem::is_directory(pki_dir)) << r.dump(2);
  EXPECT_EQ(std::filesystem::status(pki_dir).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  auto status = RunProcess({BinaryPath("tandem"), "status", "--addr", internal, "--json", "--tls-ca",
                            sec.value("ca", ""), "--tls-cert", sec.value("client_cert", ""), "--tls-key",
                            sec.value("client_key", "")});
  ASSERT_EQ(status.exit_code, 0) << status.out << status.err;
  const nlohmann::json replicas = nlohmann::json::parse(status.out, nullptr, false);
  ASSERT_TRUE(replicas.is_object()) << status.out;
  EXPECT_EQ(replicas["replicas"].size(), 3u) << status.out;  // prefill, decode, kvstore
  auto refused = RunProcess({BinaryPath("tandem"), "status", "--addr", internal});
  EXPECT_NE(refused.exit_code, 0) << refused.out;
  auto on_public = RunProcess({BinaryPath("tandem"), "status", "--addr", router});  // plaintext public port
  EXPECT_NE(on_public.exit_code, 0);
  EXPECT_NE(on_public.err.find("UNIMPLEMENTED"), std::string::npos) << on_public.err;
  EXPECT_EQ(cluster.Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(pki_dir)) << "the throwaway CA outlived serve-local";
}

// The warm-up must not make measured requests cache hits: with distinct random prompts of
// several full KV blocks each (200 tokens: 3 blocks of 64) and a cluster whose prefill
// replica has a prefix cache and a kvstore behind it, no measured request may report a
// cached prompt token. A warm-up that resends measured prompts (the old one did: request i
// of the warm-up was measured request i) makes the first --num-warmup of them hits.
TEST(BenchTest, WarmupPromptsAreNeverMeasured) {
  TempDir tmp;
  std::unique_ptr<BackgroundProcess> cluster;
  const std::string router = StartServeLocal(tmp, &cluster);
  ASSERT_FALSE(router.empty());
  const std::string json_file = tmp.Sub("bench.json");
  auto bench = RunProcess({BinaryPath("tandem"), "bench", "--addr", router, "--num-prompts", "6", "--num-warmup", "3",
                           "--max-concurrency", "1", "--input-len", "200", "--output-len", "2", "--ignore-eos",
                           "--seed", "7", "--json", json_file, "--no-progress"},
                          {}, 300);
  ASSERT_EQ(bench.exit_code, 0) << bench.out << bench.err;
  const nlohmann::json j = nlohmann::json::parse(ReadFileToString(json_file).value(), nullptr, false);
  ASSERT_TRUE(j.is_object()) << ReadFileToString(json_file).value_or("");
  const nlohmann::json& result = j["result"];
  EXPECT_EQ(result.value("completed", -1), 6) << result.dump(2);
  EXPECT_EQ(result.value("cached_input_tokens", -1), 0) << result.dump(2);
  EXPECT_EQ(result.value("requests_with_cached_tokens", -1), 0) << result.dump(2);
  const size_t line = bench.out.find("Requests with cached prompt tokens:");
  ASSERT_NE(line, std::string::npos) << bench.out;
  const std::string row = bench.out.substr(line, bench.out.find('\n', line) - line);
  EXPECT_TRUE(row.size() > 7 && row.compare(row.size() - 7, 7, " 0 of 6") == 0) << row;
  EXPECT_EQ(cluster->Stop(), 0);
}

// The OpenAI backends through the router's HTTP API: every request completes with exactly
// max_tokens tokens (--ignore-eos, counted from the usage event), and the answers were
// streamed: several text events per request, timed at different reads (a client that
// parsed the body once it ended, or a server that sent it whole, gives gaps of exactly
// 0 and a TTFT equal to the end), over kept-alive connections (no more than the
// concurrency). Failures are counted per HTTP status; --compare-backends runs both
// backends and reports their TTFT medians' difference.
TEST(BenchTest, OpenAiBackendsStreamThroughTheHttpApi) {
  TempDir tmp;
  std::unique_ptr<BackgroundProcess> cluster;
  std::string http;
  const std::string router = StartServeLocal(tmp, &cluster, &http);
  ASSERT_FALSE(router.empty());
  ASSERT_FALSE(http.empty()) << "serve-local's ready file names no http address";
  const std::string base_url = "http://" + http + "/v1";
  constexpr int kRequests = 12, kMaxTokens = 10, kConcurrency = 4;
  for (const std::string backend : {"openai-completions", "openai-chat"}) {
    SCOPED_TRACE(backend);
    const std::string json_file = tmp.Sub(backend + ".json");
    auto bench = RunProcess({BinaryPath("tandem"), "bench", "--backend", backend, "--base-url", base_url,
                             "--num-prompts", std::to_string(kRequests), "--max-concurrency",
                             std::to_string(kConcurrency), "--input-len", "24", "--output-len",
                             std::to_string(kMaxTokens), "--ignore-eos", "--num-warmup", "2", "--json", json_file,
                             "--no-progress"},
                            {}, 300);
    ASSERT_EQ(bench.exit_code, 0) << bench.out << bench.err;
    const nlohmann::json j = ReadJson(json_file);
    ASSERT_TRUE(j.is_object()) << ReadFileToString(json_file).value_or("");
    EXPECT_EQ(j.value("backend", ""), backend);
    EXPECT_EQ(j.value("base_url", ""), base_url);
    const nlohmann::json& r = j["result"];
    EXPECT_EQ(r.value("completed", -1), kRequests) << r.dump(2);
    EXPECT_EQ(r.value("failed", -1), 0);
    EXPECT_EQ(r.value("total_output_tokens", -1), kRequests * kMaxTokens) << r.dump(2);
    EXPECT_GT(r.value("total_input_tokens", 0), 0);
    EXPECT_GT(r.value("total_output_chunks", 0), 2 * kRequests) << r.dump(2);
    EXPECT_GT(r["itl_ms"].value("median", 0.0), 0) << r.dump(2);
    EXPECT_GT(r["tpot_ms"].value("median", 0.0), 0) << r.dump(2);
    EXPECT_LT(r["ttft_ms"].value("median", 0.0), r["e2e_latency_ms"].value("median", 0.0)) << r.dump(2);
    const int connections = r["transport"].value("http_connections_opened", -1);
    EXPECT_GE(connections, 1) << r.dump(2);
    EXPECT_LE(connections, kConcurrency) << "connections were not kept alive\n" << r.dump(2);
  }

  // A model the cluster does not serve: every request fails with 404, counted as such.
  const std::string refused_json = tmp.Sub("refused.json");
  auto refused = RunProcess({BinaryPath("tandem"), "bench", "--backend", "openai-completions", "--base-url", base_url,
                             "--model", "no-such-model", "--num-prompts", "3", "--num-warmup", "0", "--input-len", "8",
                             "--output-len", "2", "--json", refused_json, "--no-progress"},
                            {}, 120);
  EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
  const nlohmann::json rj = ReadJson(refused_json);
  ASSERT_TRUE(rj.is_object()) << refused.out << refused.err;
  EXPECT_EQ(rj["result"].value("failed", -1), 3) << rj.dump(2);
  EXPECT_EQ(rj["result"]["errors_by_class"].value("http 404", -1), 3) << rj.dump(2);

  // Both paths in one run, alternating in rounds.
  const std::string compare_json = tmp.Sub("compare.json");
  auto compare = RunProcess({BinaryPath("tandem"), "bench", "--compare-backends", "grpc,openai-completions", "--addr",
                             router, "--base-url", base_url, "--num-prompts", "8", "--compare-rounds", "2",
                             "--max-concurrency", "2", "--input-len", "16", "--output-len", "6", "--ignore-eos",
                             "--json", compare_json, "--no-progress"},
                            {}, 300);
  ASSERT_EQ(compare.exit_code, 0) << compare.out << compare.err;
  EXPECT_NE(compare.out.find("Median TTFT, openai-completions - grpc:"), std::string::npos) << compare.out;
  const nlohmann::json cj = ReadJson(compare_json);
  ASSERT_TRUE(cj.is_object()) << compare.out;
  EXPECT_EQ(cj.value("benchmark", ""), "serving-compare");
  for (const char* backend : {"grpc", "openai-completions"}) {
    const nlohmann::json& r = cj["results"][backend];
    EXPECT_EQ(r.value("completed", -1), 8) << backend << "\n" << cj.dump(2);
    EXPECT_EQ(r.value("total_output_tokens", -1), 8 * 6) << backend;
  }
  ASSERT_EQ(cj["comparison"].size(), 1u) << cj.dump(2);
  const nlohmann::json& c = cj["comparison"][0];
  EXPECT_EQ(c.value("backend", ""), "openai-completions");
  EXPECT_EQ(c.value("baseline", ""), "grpc");
  EXPECT_DOUBLE_EQ(c.value("ttft_p50_diff_ms", 0.0),
                   cj["results"]["openai-completions"]["ttft_ms"].value("median", 0.0) -
                       cj["results"]["grpc"]["ttft_ms"].value("median", 0.0));
  EXPECT_GT(c.value("ttft_p50_ratio", 0.0), 0);
  EXPECT_EQ(c["round_ttft_p50_diff_ms"].size(), 2u);
  EXPECT_EQ(cluster->Stop(), 0);
}

}  // namespace
}  // namespace tandem
