// KvWriterProber (kv_writer_prober.h) over a scripted WriterStateClient: which answers
// prove a writer stopped (its own "not writing", another incarnation at its address,
// nothing listening there) and which prove nothing (a call that times out while
// something still accepts connections: a stopped process; "still writing").
#include "services/decode/kv_writer_prober.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Answers each Ask with the next scripted answer for its address, inline; a missing one
// is a call that failed (DEADLINE_EXCEEDED).
class ScriptedClient final : public WriterStateClient {
 public:
  void Ask(const std::string& address, const v1::WriterStateRequest& request,
           std::function<void(absl::StatusOr<v1::WriterStateResponse>)> done) override {
    absl::StatusOr<v1::WriterStateResponse> answer = absl::DeadlineExceededError("no answer");
    {
      std::lock_guard<std::mutex> lock(mu_);
      asks_.push_back({address, request});
      auto& q = answers_[address];
      if (!q.empty()) {
        answer = q.front();
        q.pop_front();
      }
      cv_.notify_all();
    }
    done(std::move(answer));
  }
  bool NothingListens(const std::string& address) override {
    std::lock_guard<std::mutex> lock(mu_);
    return gone_.contains(address);
  }

  void Answer(const std::string& address, absl::StatusOr<v1::WriterStateResponse> a) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_[address].push_back(std::move(a));
  }
  void SetGone(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu_);
    gone_.insert(address);
  }
  // Waits (on the prober's progress, no clock bound) for `n` asks in all.
  void AwaitAsks(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return asks_.size() >= n; });
  }
  size_t asks() {
    std::lock_guard<std::mutex> lock(mu_);
    return asks_.size();
  }
  v1::WriterStateRequest ask(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return asks_.at(i).second;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<absl::StatusOr<v1::WriterStateResponse>>> answers_;
  std::set<std::string> gone_;
  std::vector<std::pair<std::string, v1::WriterStateRequest>> asks_;
};

struct Found {
  std::string lease;
  uint64_t token;
  uint64_t incarnation;
  KvWriterProof proof;
};

class KvWriterProberTest : public ::testing::Test {
 protected:
  KvWriterProberTest()
      : prober_(&client_,
                [this](const std::string& id, uint64_t token, uint64_t inc, KvWriterProof p) {
                  std::lock_guard<std::mutex> lock(mu_);
                  found_.push_back({id, token, inc, p});
                  cv_.notify_all();
                },
                {.first_ask = std::chrono::milliseconds(1), .max_backoff = std::chrono::milliseconds(4)}) {}

  std::vector<Found> AwaitFound(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return found_.size() >= n; });
    return found_;
  }
  size_t found() {
    std::lock_guard<std::mutex> lock(mu_);
    return found_.size();
  }

  static v1::WriterStateResponse From(uint64_t incarnation, std::vector<std::pair<std::string, uint64_t>> writing = {}) {
    v1::WriterStateResponse r;
    r.set_incarnation(incarnation);
    for (auto& [id, token] : writing) {
      v1::LeaseRef* l = r.add_writing();
      l->set_lease_id(id);
      l->set_lease_token(token);
    }
    return r;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Found> found_;
  ScriptedClient client_;
  KvWriterProber prober_;  // last: its thread uses the above
};

const KvWriter kA{.address = "a:1", .incarnation = 0xa};

TEST_F(KvWriterProberTest, TheWriterSayingItHoldsNoWritesEndsIt) {
  client_.Answer("a:1", From(0xa));
  prober_.OnQuarantined("l", 7, {kA});
  std::vector<Found> f = AwaitFound(1);
  EXPECT_EQ(f[0].lease, "l");
  EXPECT_EQ(f[0].token, 7u);
  EXPECT_EQ(f[0].incarnation, 0xau);
  EXPECT_EQ(f[0].proof, KvWriterProof::kEnded);
  ASSERT_GE(client_.asks(), 1u);
  ASSERT_EQ(client_.ask(0).leases_size(), 1);
  EXPECT_EQ(client_.ask(0).leases(0).lease_id(), "l");
  EXPECT_EQ(client_.ask(0).leases(0).lease_token(), 7u);
  EXPECT_EQ(prober_.pending(), 0u);
}

TEST_F(KvWriterProberTest, AnotherIncarnationAtTheAddressMeansTheWriterIsGone) {
  client_.Answer("a:1", From(0xb, {{"l", 7}}));  // a new process, even one writing that lease
  prober_.OnQuarantined("l", 7, {kA});
  std::vector<Found> f = AwaitFound(1);
  EXPECT_EQ(f[0].proof, KvWriterProof::kGone);
}

TEST_F(KvWriterProberTest, NothingListeningAfterAFailedCallMeansTheWriterIsGone) {
  client_.SetGone("a:1");
  prober_.OnQuarantined("l", 7, {kA});
  std::vector<Found> f = AwaitFound(1);
  EXPECT_EQ(f[0].proof, KvWriterProof::kGone);
}

TEST_F(KvWriterProberTest, AStoppedOrStillWritingWriterProvesNothingUntilItAnswers) {
  // Still writing, then two calls that time out while its port accepts connections (a
  // SIGSTOPped process), then its own "done".
  client_.Answer("a:1", From(0xa, {{"l", 7}}));
  client_.Answer("a:1", absl::DeadlineExceededError("stopped"));
  client_.Answer("a:1", absl::DeadlineExceededError("stopped"));
  client_.Answer("a:1", From(0xa));
  prober_.OnQuarantined("l", 7, {kA});
  std::vector<Found> f = AwaitFound(1);
  EXPECT_GE(client_.asks(), 4u) << "proof before the writer's own answer";
  EXPECT_EQ(f[0].proof, KvWriterProof::kEnded);
}

TEST_F(KvWriterProberTest, OneAskCoversEveryLeaseOfAnAddressAndEachGetsItsOwnFinding) {
  prober_.OnQuarantined("l1", 1, {kA});
  prober_.OnQuarantined("l2", 2, {kA});
  prober_.OnQuarantined("l3", 3, {{.address = "b:1", .incarnation = 0xb}});
  client_.Answer("a:1", From(0xa, {{"l2", 2}}));
  client_.Answer("a:1", From(0xa));
  client_.Answer("b:1", From(0xb));
  std::vector<Found> f = AwaitFound(3);
  std::map<std::string, KvWriterProof> by_lease;
  for (const Found& x : f) by_lease[x.lease] = x.proof;
  EXPECT_EQ(by_lease.size(), 3u);
  EXPECT_EQ(by_lease["l1"], KvWriterProof::kEnded);
  EXPECT_EQ(by_lease["l2"], KvWriterProof::kEnded);
  EXPECT_EQ(by_lease["l3"], KvWriterProof::kEnded);
}

TEST_F(KvWriterProberTest, AQuarantineThatEndedIsNotAskedAboutAgain) {
  prober_.OnQuarantined("l", 7, {kA});  // unanswered: asked again and again
  client_.AwaitAsks(2);
  prober_.OnQuarantineEnded("l", 7);
  EXPECT_EQ(prober_.pending(), 0u);
  const size_t asked = client_.asks();
  client_.Answer("a:1", From(0xa));
  // A later quarantine at the same address is asked about alone.
  prober_.OnQuarantined("m", 8, {kA});
  std::vector<Found> f = AwaitFound(1);
  EXPECT_EQ(f[0].lease, "m");
  EXPECT_LE(client_.asks(), asked + 2);  // at most the one in flight when it ended, and m's
  EXPECT_EQ(found(), 1u);
}

}  // namespace
}  // namespace tandem
