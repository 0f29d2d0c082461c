// The router's dashboard history: histogram quantiles as Prometheus computes them, rates
// and percentiles between samples of the router's real metrics, replica series.
#include "services/router/metrics_history.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/router/dashboard_api.h"
#include "services/router/router_metrics.h"

namespace tandem {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(HistogramQuantileTest, InterpolatesWithinTheBucketLikePrometheus) {
  // histogram_quantile over buckets le=0.1:10, 0.2:30, 0.5:40, +Inf:40.
  HistogramCounts h{.upper_bounds = {0.1, 0.2, 0.5, kInf}, .cumulative = {10, 30, 40, 40}, .count = 40, .sum = 6};
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.5, h), 0.15);        // rank 20: half way into (0.1, 0.2]
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.99, h), 0.2 + 0.3 * 0.96);
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.1, h), 0.04);        // first bucket: lower bound 0
  EXPECT_DOUBLE_EQ(*HistogramQuantile(1.0, h), 0.5);
  EXPECT_FALSE(HistogramQuantile(0.5, HistogramCounts{}).has_value());
  EXPECT_FALSE(HistogramQuantile(1.5, h).has_value());
  // Everything above the highest finite bound: that bound is all that is known.
  HistogramCounts high{.upper_bounds = {0.1, 0.5, kInf}, .cumulative = {0, 0, 5}, .count = 5, .sum = 10};
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.5, high), 0.5);
  HistogramCounts empty{.upper_bounds = {0.1, kInf}, .cumulative = {0, 0}};
  EXPECT_FALSE(HistogramQuantile(0.5, empty).has_value());
}

TEST(HistogramQuantileTest, DeltaSubtractsBucketByBucket) {
  HistogramCounts a{.upper_bounds = {0.1, kInf}, .cumulative = {1, 2}, .count = 2, .sum = 0.3};
  HistogramCounts b{.upper_bounds = {0.1, kInf}, .cumulative = {4, 7}, .count = 7, .sum = 1.3};
  HistogramCounts d = Delta(b, a);
  EXPECT_EQ(d.cumulative, (std::vector<double>{3, 5}));
  EXPECT_DOUBLE_EQ(d.count, 5);
  EXPECT_DOUBLE_EQ(d.sum, 1.0);
  HistogramCounts other{.upper_bounds = {0.2, kInf}, .cumulative = {1, 1}};
  EXPECT_TRUE(Delta(b, other).cumulative.empty());  // different buckets: nothing comparable
}

class MetricsHistoryTest : public ::testing::Test {
 protected:
  MetricsHistoryTest()
      : registry_(std::make_shared<prometheus::Registry>()),
        metrics_(*registry_, "tiny"),
        history_(registry_, [this] { return loads_; }, {.interval = std::chrono::milliseconds(1000), .capacity = 100}) {}

  void Finish(int n, double ttft_s, grpc::StatusCode code = grpc::StatusCode::OK) {
    for (int i = 0; i < n; ++i) {
      metrics_.RequestStarted();
      metrics_.RequestFinished({.code = code, .prompt_tokens = 100, .completion_tokens = 20,
                                .cached_prompt_tokens = 64, .ttft_s = ttft_s, .e2e_s = ttft_s + 0.5});
      metrics_.InterTokenLatency(0.012);
    }
  }

  std::shared_ptr<prometheus::Registry> registry_;
  RouterMetrics metrics_;
  std::vector<MetricsHistory::ReplicaLoad> loads_;
  MetricsHistory history_;
};

TEST_F(MetricsHistoryTest, SummaryRatesAndPercentilesOverTheWindow) {
  history_.Record(0, 1000);
  Finish(10, 0.05);  // before the window below: excluded
  history_.Record(10, 1010);
  Finish(18, 0.03);
  Finish(2, 0.7, grpc::StatusCode::RESOURCE_EXHAUSTED);
  history_.Record(20, 1020);

  const nlohmann::json j = history_.ToJson({.window_s = 10, .series_s = 300, .step_s = 10});
  ASSERT_TRUE(j["metrics_enabled"].get<bool>());
  const nlohmann::json& s = j["summary"];
  EXPECT_DOUBLE_EQ(s["requests"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(s["requests_per_s"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(s["failed_per_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(s["outcomes"]["resource_exhausted"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(s["prompt_tokens_per_s"].get<double>(), 200);
  EXPECT_DOUBLE_EQ(s["generation_tokens_per_s"].get<double>(), 40);
  EXPECT_DOUBLE_EQ(s["cache_hit_ratio"].get<double>(), 0.64);
  // 18 of 20 TTFTs in (0.02, 0.04], 2 in (0.5, 0.75]: p50 in the first, p99 in the second.
  EXPECT_GT(s["ttft_p50_s"].get<double>(), 0.02);
  EXPECT_LE(s["ttft_p50_s"].get<double>(), 0.04);
  EXPECT_GT(s["ttft_p99_s"].get<double>(), 0.5);
  EXPECT_LE(s["ttft_p99_s"].get<double>(), 0.75);
  EXPECT_NEAR(s["ttft_mean_s"].get<double>(), (18 * 0.03 + 2 * 0.7) / 20, 1e-9);
  EXPECT_GT(s["itl_p50_s"].get<double>(), 0.01);
  EXPECT_LE(s["itl_p50_s"].get<double>(), 0.015);

  // Series: one point per sample, each over the step before it (the first has none).
  const nlohmann::json& series = j["series"];
  ASSERT_EQ(series["t"].size(), 3u);
  EXPECT_DOUBLE_EQ(series["t"][2].get<double>(), 1020);
  EXPECT_TRUE(series["ttft_p50_s"][0].is_null());
  EXPECT_DOUBLE_EQ(series["requests_per_s"][1].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(series["requests_per_s"][2].get<double>(), 2.0);

  // A window longer than the history covers all of it.
  const nlohmann::json all = history_.ToJson({.window_s = 3600});
  EXPECT_DOUBLE_EQ(all["summary"]["requests"].get<double>(), 30);
  // Since a wall-clock time: from the last sample at or before it.
  const nlohmann::json since = history_.ToJson({.since_unix_s = 1015});
  EXPECT_DOUBLE_EQ(since["summary"]["requests"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(since["summary"]["span_s"].get<double>(), 10);
}

TEST_F(MetricsHistoryTest, NoRequestsMeansNullPercentilesNotZero) {
  history_.Record(0, 1000);
  history_.Record(5, 1005);
  const nlohmann::json s = history_.ToJson({.window_s = 30})["summary"];
  EXPECT_TRUE(s["ttft_p99_s"].is_null());
  EXPECT_TRUE(s["cache_hit_ratio"].is_null());
  EXPECT_DOUBLE_EQ(s["requests_per_s"].get<double>(), 0);
}

TEST_F(MetricsHistoryTest, ReplicaSeriesAlignWithTimeAndShowGaps) {
  loads_ = {{.id = "p0", .role = "prefill", .state = "ready", .running = 1, .waiting = 2, .kv_usage = 0.25}};
  history_.Record(0, 1000);
  loads_.push_back({.id = "d0", .role = "decode", .state = "ready", .running = 3, .kv_usage = 0.5});
  history_.Record(1, 1001);
  loads_.erase(loads_.begin());
  history_.Record(2, 1002);
  const nlohmann::json r = history_.ToJson({})["replicas"];
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["id"], "p0");
  EXPECT_EQ(r[0]["waiting"], nlohmann::json({2, 2, nullptr}));
  EXPECT_EQ(r[1]["id"], "d0");
  EXPECT_EQ(r[1]["role"], "decode");
  EXPECT_EQ(r[1]["running"], nlohmann::json({nullptr, 3, 3}));
  EXPECT_EQ(r[1]["kv_usage"], nlohmann::json({nullptr, 0.5, 0.5}));
}

TEST_F(MetricsHistoryTest, KeepsAtMostCapacitySamplesAndSamplesOnItsThread) {
  for (int i = 0; i < 150; ++i) history_.Record(i, 1000 + i);
  EXPECT_EQ(history_.ToJson({})["samples"].get<size_t>(), 100u);

  MetricsHistory live(registry_, nullptr, {.interval = std::chrono::milliseconds(10), .capacity = 1000});
  live.Start();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (live.ToJson({})["samples"].get<size_t>() < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  live.Stop();
  EXPECT_GE(live.ToJson({})["samples"].get<size_t>(), 3u);
}

TEST(DashboardApiTest, ParsesTheSummaryQuery) {
  MetricsHistory::Query q = ParseSummaryQuery("window=60&step=5&series=600&junk=1&window2=3");
  EXPECT_DOUBLE_EQ(q.window_s, 60);
  EXPECT_DOUBLE_EQ(q.step_s, 5);
  EXPECT_DOUBLE_EQ(q.series_s, 600);
  EXPECT_FALSE(q.since_unix_s.has_value());
  q = ParseSummaryQuery("window=abc&step=-4&series=1e9&since=1795980000.25");
  EXPECT_DOUBLE_EQ(*q.since_unix_s, 1795980000.25);
  EXPECT_DOUBLE_EQ(q.window_s, MetricsHistory::Query{}.window_s);
  EXPECT_DOUBLE_EQ(q.step_s, 1);
  EXPECT_DOUBLE_EQ(q.series_s, 3600);
}

}  // namespace
}  // namespace tandem
