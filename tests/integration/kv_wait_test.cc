// Requests that find the decode replica's KV pool full wait in the replica's queue, with
// one Reserve each, instead of re-sending Reserve every 20 ms (the old router: about 50
// Reserve calls per waiting request per second). A small pool (--kv-cache-mb=1) and more
// concurrent requests than it holds; the decode replica counts its Reserve calls
// (tandem_decode_reserve_requests_total) and the reservations waiting in its queue.
#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::GenerationStub;
using testing::StartCluster;
using testing::StreamResult;
using testing::TextRequest;

std::string Words(int n, int salt) {
  static const char* kWords[] = {"alpha", "beta", "gamma", "delta", "router", "prefill", "decode", "cache"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(kWords[(i * 5 + salt * 3 + i / 7) % 8]) + " ";
  return s;
}

// The value of an unlabelled metric in a Prometheus text page (-1: absent).
double Metric(const std::string& page, const std::string& name) {
  size_t pos = 0;
  while ((pos = page.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || page[pos - 1] == '\n';
    const size_t after = pos + name.size();
    if (line_start && after < page.size() && (page[after] == ' ' || page[after] == '{')) {
      const size_t space = page.find(' ', after);
      return std::stod(page.substr(space + 1, page.find('\n', space) - space - 1));
    }
    pos = after;
  }
  return -1;
}

TEST(KvWaitTest, WaitingRequestsSendOneReserveEachNotOneEvery20Ms) {
  auto cluster = StartCluster(1, 1, 0, {"--kv-cache-mb=1"});
  ASSERT_NE(cluster, nullptr);
  std::string decode_admin;
  for (const ProcessInfo& p : cluster->processes()) {
    if (p.role == "decode") decode_admin = p.ready.value("admin", "");
  }
  ASSERT_FALSE(decode_admin.empty());
  const double before = Metric(testing::HttpGet(decode_admin, "/metrics"), "tandem_decode_reserve_requests_total");
  ASSERT_GE(before, 0) << "the decode replica does not export tandem_decode_reserve_requests_total";

  constexpr int kRequests = 24;
  auto stub = GenerationStub(cluster->router_address());
  std::vector<StreamResult> got(kRequests);
  std::atomic<bool> done{false};
  std::atomic<double> max_waiting{0};
  std::thread watcher([&] {
    while (!done) {
      const double w = Metric(testing::HttpGet(decode_admin, "/metrics"), "tandem_decode_reserve_waiting");
      if (w > max_waiting) max_waiting = w;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(*stub, TextRequest(Words(150, i), 40, i, 0.7f), 120); });
  }
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  watcher.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens.size(), 40u) << i;
  }
  const double reserves =
      Metric(testing::HttpGet(decode_admin, "/metrics"), "tandem_decode_reserve_requests_total") - before;
  std::printf("%d requests in %.1f s: %.0f Reserve calls, up to %.0f waiting in the replica's queue\n", kRequests,
              took, reserves, max_waiting.load());
  EXPECT_GT(max_waiting.load(), 0) << "the pool never filled: the test does not exercise waiting";
  // At most a probe and one wait per request.
  EXPECT_LE(reserves, 2 * kRequests);
}

}  // namespace
}  // namespace tandem
