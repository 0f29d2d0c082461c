// `tandem bench` as a user runs it against `tandem serve-local`: a full report on stdout
// and a JSON file with every figure.
#include <filesystem>
#include <fstream>
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

TEST(BenchTest, ReportAndJsonAgainstServeLocal) {
  TempDir tmp;
  const std::string ready = tmp.Sub("ready.json");
  BackgroundProcess cluster({BinaryPath("tandem"), "serve-local", "--listen", "127.0.0.1:0", "--threads", "1",
                             "--ready-file", ready, "--run-dir", tmp.Sub("run")},
                            tmp.Sub("serve-local.log"));
  ASSERT_GT(cluster.pid(), 0);
  for (int i = 0; i < 1200 && !std::filesystem::exists(ready); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << ReadFileToString(tmp.Sub("serve-local.log")).value_or("");
  const nlohmann::json r = nlohmann::json::parse(ReadFileToString(ready).value());
  const std::string router = r["router"].value("grpc", "");
  ASSERT_FALSE(router.empty()) << r.dump();

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
                           "P99 E2EL (ms):", "Total input tokens from prefix cache:"}) {
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
  EXPECT_EQ(cluster.Stop(), 0);
}

}  // namespace
}  // namespace tandem
