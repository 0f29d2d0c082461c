// Engine::ReserveKvAsync: reservations that do not fit wait in a bounded FIFO and are
// made as blocks free (first come, first served), end RESOURCE_EXHAUSTED when their wait
// runs out or the queue is full, CANCELLED on Cancel; SubmitImportedAsync completes
// through its callback.
#include <atomic>
#include <map>
#include <optional>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Tokens;

std::unique_ptr<Engine> MakeEngine(EngineOptions o) {
  o.num_threads = 1;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(testing::SmallTinyModelDir(), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// Completions of ReserveKvAsync calls, by id, in the order they came.
class Completions {
 public:
  Engine::ReserveDone For(const std::string& id) {
    return [this, id](absl::StatusOr<KvLeases::Reservation> r) {
      std::lock_guard<std::mutex> lock(mu_);
      order_.push_back(id);
      codes_[id] = r.status().code();
      cv_.notify_all();
    };
  }
  // Waits (on the engine thread's progress, not a clock bound) until `n` have come.
  std::vector<std::string> Await(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return order_.size() >= n; });
    return order_;
  }
  absl::StatusCode Code(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_.at(id);
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> order_;
  std::map<std::string, absl::StatusCode> codes_;
};

// A stat as the engine publishes it after each loop iteration: polled until it reads
// `want` (or a generous number of tries: the engine thread's progress, not a clock).
int64_t StatBecomes(Engine& e, int64_t EngineStats::*field, int64_t want) {
  int64_t v = 0;
  for (int i = 0; i < 2000 && (v = e.Stats().*field) != want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return v;
}

// 64-token blocks; ReserveKv(n) takes the blocks of n + 1 positions.
constexpr int32_t TokensForBlocks(int blocks) { return blocks * 64 - 1; }

TEST(EngineKvWaitTest, WaitingReservationsAreMadeAsBlocksFree) {
  auto e = MakeEngine({.num_kv_blocks = 8});
  Completions c;
  e->ReserveKvAsync("a", TokensForBlocks(6), 0, c.For("a"));
  ASSERT_EQ(c.Await(1)[0], "a");
  ASSERT_EQ(c.Code("a"), absl::StatusCode::kOk);
  e->ReserveKvAsync("b", TokensForBlocks(4), 60, c.For("b"));  // 2 free: waits
  e->ReserveKvAsync("c", TokensForBlocks(3), 60, c.For("c"));  // waits too
  e->ReserveKvAsync("d", TokensForBlocks(1), 60, c.For("d"));  // fits: made at once
  e->ReserveKvAsync("e", TokensForBlocks(9), 60, c.For("e"));  // larger than the pool: refused
  e->ReserveKvAsync("f", TokensForBlocks(2), 0, c.For("f"));   // no wait: refused at once
  std::vector<std::string> order = c.Await(4);
  EXPECT_EQ(c.Code("d"), absl::StatusCode::kOk);
  EXPECT_EQ(c.Code("e"), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(c.Code("f"), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_reserve_waiting, 2), 2);
  e->Cancel("a");  // frees 6 blocks (7 free): b, then c
  order = c.Await(6);
  EXPECT_EQ(order[4], "b");
  EXPECT_EQ(order[5], "c");
  EXPECT_EQ(c.Code("b"), absl::StatusCode::kOk);
  EXPECT_EQ(c.Code("c"), absl::StatusCode::kOk);
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_reserve_requests, 6), 6);
}

// A large waiting reservation does not hold back a smaller one that fits.
TEST(EngineKvWaitTest, ALargeWaiterDoesNotBlockSmallerOnes) {
  auto e = MakeEngine({.num_kv_blocks = 8});
  Completions c;
  e->ReserveKvAsync("a", TokensForBlocks(4), 0, c.For("a"));
  e->ReserveKvAsync("b", TokensForBlocks(3), 0, c.For("b"));
  c.Await(2);
  e->ReserveKvAsync("big", TokensForBlocks(5), 60, c.For("big"));
  e->ReserveKvAsync("small", TokensForBlocks(3), 60, c.For("small"));
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_reserve_waiting, 2), 2);
  e->Cancel("b");  // 4 free: small fits, big does not
  ASSERT_EQ(c.Await(3)[2], "small");
  e->Cancel("a");
  ASSERT_EQ(c.Await(4)[3], "big");
  EXPECT_EQ(c.Code("big"), absl::StatusCode::kOk);
}

TEST(EngineKvWaitTest, AWaitRunsOutTheQueueIsBoundedAndCancelWithdraws) {
  std::atomic<double> now{1000.0};
  auto e = MakeEngine({.num_kv_blocks = 4, .max_kv_waiters = 2, .clock = [&now] { return now.load(); }});
  Completions c;
  e->ReserveKvAsync("full", TokensForBlocks(4), 0, c.For("full"));
  c.Await(1);
  e->ReserveKvAsync("w1", 10, 1.0, c.For("w1"));
  e->ReserveKvAsync("w2", 10, 5.0, c.For("w2"));
  e->ReserveKvAsync("w3", 10, 5.0, c.For("w3"));  // the queue holds 2
  ASSERT_EQ(c.Await(2)[1], "w3");
  EXPECT_EQ(c.Code("w3"), absl::StatusCode::kResourceExhausted);
  now = 1002.0;
  e->Cancel("unrelated");  // wakes the engine thread
  ASSERT_EQ(c.Await(3)[2], "w1");
  EXPECT_EQ(c.Code("w1"), absl::StatusCode::kResourceExhausted);
  e->Cancel("w2");
  ASSERT_EQ(c.Await(4)[3], "w2");
  EXPECT_EQ(c.Code("w2"), absl::StatusCode::kCancelled);
  EXPECT_EQ(StatBecomes(*e, &EngineStats::kv_reserve_waiting, 0), 0);
}

TEST(EngineKvWaitTest, SubmitImportedAsyncCompletesThroughItsCallback) {
  auto e = MakeEngine({.num_kv_blocks = 8});
  ASSERT_TRUE(e->ReserveKv("r", 10).ok());
  EngineRequest req;
  req.id = "r";
  req.prompt = Tokens(10, 1);
  req.stop.max_tokens = 3;
  req.stop.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<absl::StatusOr<std::shared_ptr<OutputStream>>> got;
  e->SubmitImportedAsync(req, 5, true, Engine::ImportedKv::kHostPool,
                         [&](absl::StatusOr<std::shared_ptr<OutputStream>> s) {
                           std::lock_guard<std::mutex> lock(mu);
                           got = std::move(s);
                           cv.notify_all();
                         });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return got.has_value(); });
  }
  ASSERT_TRUE(got->ok()) << got->status();
  int tokens = 0;
  for (RequestOutput o; (**got)->Next(&o);) tokens += static_cast<int>(o.token_ids.size());
  EXPECT_EQ(tokens, 3);
  // Without a reservation: FAILED_PRECONDITION through the callback, the id free again.
  req.id = "none";
  std::optional<absl::Status> err;
  e->SubmitImportedAsync(req, 5, true, Engine::ImportedKv::kHostPool,
                         [&](absl::StatusOr<std::shared_ptr<OutputStream>> s) {
                           std::lock_guard<std::mutex> lock(mu);
                           err = s.status();
                           cv.notify_all();
                         });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return err.has_value(); });
  EXPECT_EQ(err->code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem
