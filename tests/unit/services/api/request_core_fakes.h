// Hand-written fakes for request_core_test.cc: replicas whose calls complete when the
// test says, a manual clock, a recording sink. Each fake replica also checks the lease
// rules the core must keep: a lease is released at most once, and never while a prefill
// that writes into it has not ended.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "services/api/downstream.h"
#include "services/api/response_sink.h"

namespace tandem::testing {

class FakeCall final : public PendingCall {
 public:
  void Cancel() override { cancelled = true; }
  std::atomic<bool> cancelled{false};
};

// Prefills in flight into each lease id, across every replica (prefill and decode
// replicas share it: a release is judged against the prefills writing into the lease).
struct LeaseLedger {
  std::map<std::string, int> prefills_writing;
  std::map<std::string, int> releases;
  // The ended writer each release named (ReleaseRequest.ended_writer_incarnation).
  std::map<std::string, uint64_t> release_proofs;
  std::vector<std::string> violations;
};

// The writer incarnation the fake prefill replicas answer with (PrefillResponse).
inline constexpr uint64_t kFakeWriterIncarnation = 0x77;

class FakeReplica final : public ReplicaHandle {
 public:
  struct PendingReserve {
    v1::ReserveRequest req;
    std::function<void(absl::StatusOr<v1::ReserveResponse>)> done;
    std::shared_ptr<FakeCall> call;
    bool completed = false;
  };
  struct PendingPrefill {
    v1::PrefillRequest req;
    std::function<void(absl::StatusOr<v1::PrefillResponse>)> done;
    std::shared_ptr<FakeCall> call;
    bool completed = false;
  };
  class Stream final : public DownstreamStream {
   public:
    void Read() override { ++reads; }
    void Cancel() override { cancelled = true; }
    v1::DecodeRequest decode_req;
    v1::GenerateRequest generate_req;
    StreamHandlers handlers;
    int pushed = 0;  // tokens sent on the stream
    std::atomic<int> reads{0};  // atomic: ConcurrentEventsAreSerialized reads from other threads
    std::atomic<bool> cancelled{false};
    bool ended = false;
  };

  FakeReplica(std::string id, LeaseLedger* ledger) : id_(std::move(id)), ledger_(ledger) {}

  const std::string& id() const override { return id_; }
  bool IsLost() const override { return lost; }
  int WaitingHere() const override { return waiting; }
  void AddWaiting(int delta) override {
    waiting += delta;
    EXPECT_GE(waiting, 0);
  }

  std::unique_ptr<PendingCall> Reserve(const CallOptions&, const v1::ReserveRequest& r,
                                       std::function<void(absl::StatusOr<v1::ReserveResponse>)> done) override {
    auto call = std::make_shared<FakeCall>();
    reserves.push_back({r, std::move(done), call});
    return std::make_unique<Forward>(call);
  }
  void Release(const CallOptions&, const std::string& lease_id, uint64_t ended_writer) override {
    released.push_back(lease_id);
    ledger_->release_proofs[lease_id] = ended_writer;
    if (++ledger_->releases[lease_id] > 1) ledger_->violations.push_back("lease " + lease_id + " released twice");
    if (ledger_->prefills_writing[lease_id] > 0) {
      ledger_->violations.push_back("lease " + lease_id + " released while a prefill writes into it");
    }
  }
  std::unique_ptr<PendingCall> Prefill(const CallOptions&, const v1::PrefillRequest& r,
                                       std::function<void(absl::StatusOr<v1::PrefillResponse>)> done) override {
    auto call = std::make_shared<FakeCall>();
    ledger_->prefills_writing[r.destination().lease_id()]++;
    prefills.push_back({r, std::move(done), call});
    return std::make_unique<Forward>(call);
  }
  std::unique_ptr<DownstreamStream> Decode(const CallOptions&, const v1::DecodeRequest& r,
                                           StreamHandlers h) override {
    auto s = std::make_shared<Stream>();
    s->decode_req = r;
    s->handlers = std::move(h);
    streams.push_back(s);
    return std::make_unique<StreamForward>(s);
  }
  std::unique_ptr<DownstreamStream> Generate(const CallOptions&, const v1::GenerateRequest& r,
                                             StreamHandlers h) override {
    auto s = std::make_shared<Stream>();
    s->generate_req = r;
    s->handlers = std::move(h);
    streams.push_back(s);
    return std::make_unique<StreamForward>(s);
  }

  // Completions, as the test decides.
  void GrantReserve(size_t i, int num_blocks = 4) {
    PendingReserve& r = reserves.at(i);
    ASSERT_FALSE(r.completed);
    r.completed = true;
    v1::ReserveResponse resp;
    resp.mutable_destination()->set_lease_id(r.req.request_id());
    for (int b = 0; b < num_blocks; ++b) resp.mutable_destination()->add_block_ids(b);
    r.done(resp);
  }
  void FailReserve(size_t i, absl::Status s) {
    PendingReserve& r = reserves.at(i);
    ASSERT_FALSE(r.completed);
    r.completed = true;
    r.done(std::move(s));
  }
  void FinishPrefill(size_t i, absl::StatusOr<v1::PrefillResponse> resp) {
    PendingPrefill& p = prefills.at(i);
    ASSERT_FALSE(p.completed);
    p.completed = true;
    ledger_->prefills_writing[p.req.destination().lease_id()]--;  // the writes have ended
    p.done(std::move(resp));
  }
  // A first token `token` (finished: it ends the request).
  void FirstToken(size_t i, int32_t token, bool finished = false) {
    v1::PrefillResponse r;
    r.set_first_token(token);
    r.set_text("t");
    r.set_finished(finished);
    if (finished) r.set_finish_reason(v1::FINISH_REASON_STOP);
    r.set_kv_bytes(100);
    r.set_cached_prompt_tokens(0);
    r.set_writer_incarnation(kFakeWriterIncarnation);
    FinishPrefill(i, r);
  }
  // `usage`: more of the final message's usage (the engine's other counts).
  void Push(size_t stream, std::vector<int32_t> tokens, bool final = false, const v1::Usage& usage = {}) {
    Stream& s = *streams.at(stream);
    ASSERT_GT(s.reads.load(), 0) << "a message the core did not ask for";
    --s.reads;
    v1::GenerateResponse m;
    for (int32_t t : tokens) m.add_token_ids(t);
    s.pushed += static_cast<int>(tokens.size());
    if (final) {
      m.set_finish_reason(v1::FINISH_REASON_LENGTH);
      *m.mutable_usage() = usage;
      // As an engine counts (Sequence::num_generated): resumed tokens, the first token
      // (sampled by the prefill replica) and its own.
      const bool decode = s.decode_req.request_id().size() > 0;
      m.mutable_usage()->set_completion_tokens(
          decode ? s.decode_req.resume_tokens_size() + 1 + s.pushed : s.pushed);
    }
    s.handlers.on_message(std::move(m));
  }
  void End(size_t stream, absl::Status st) {
    Stream& s = *streams.at(stream);
    ASSERT_FALSE(s.ended);
    s.ended = true;
    s.handlers.on_done(std::move(st));
  }

  bool lost = false;
  int waiting = 0;
  std::vector<PendingReserve> reserves;
  std::vector<PendingPrefill> prefills;
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<std::string> released;

 private:
  class Forward final : public PendingCall {
   public:
    explicit Forward(std::shared_ptr<FakeCall> c) : c_(std::move(c)) {}
    void Cancel() override { c_->Cancel(); }

   private:
    std::shared_ptr<FakeCall> c_;
  };
  class StreamForward final : public DownstreamStream {
   public:
    explicit StreamForward(std::shared_ptr<Stream> s) : s_(std::move(s)) {}
    void Read() override { s_->Read(); }
    void Cancel() override { s_->Cancel(); }

   private:
    std::shared_ptr<Stream> s_;
  };

  std::string id_;
  LeaseLedger* ledger_;
};

class FakeCluster final : public ClusterView {
 public:
  std::shared_ptr<FakeReplica> Add(v1::Role role, const std::string& id) {
    auto r = std::make_shared<FakeReplica>(id, &ledger);
    replicas[role].push_back(r);
    return r;
  }
  int Count(v1::Role role) override { return static_cast<int>(replicas[role].size()); }
  std::shared_ptr<ReplicaHandle> Pick(v1::Role role, std::span<const uint64_t>,
                                      const std::vector<std::string>& exclude) override {
    ++picks[role];
    for (const auto& r : replicas[role]) {
      if (std::find(exclude.begin(), exclude.end(), r->id()) == exclude.end()) return r;
    }
    return nullptr;
  }
  std::map<v1::Role, std::vector<std::shared_ptr<FakeReplica>>> replicas;
  std::map<v1::Role, int> picks;
  LeaseLedger ledger;
};

class FakeClock final : public RequestClock {
 public:
  struct Timer {
    CoreClock::time_point when;
    std::function<void(bool)> fire;
    bool done = false;
  };
  CoreClock::time_point Now() override { return now; }
  std::unique_ptr<PendingCall> At(CoreClock::time_point when, std::function<void(bool)> fire) override {
    auto t = std::make_shared<Timer>(Timer{when, std::move(fire)});
    timers.push_back(t);
    return std::make_unique<Handle>(t);
  }
  // Moves time on, firing the timers that come due, in order.
  void Advance(std::chrono::milliseconds d) {
    const CoreClock::time_point until = now + d;
    for (;;) {
      std::shared_ptr<Timer> next;
      for (const auto& t : timers) {
        if (!t->done && t->when <= until && (!next || t->when < next->when)) next = t;
      }
      if (!next) break;
      now = std::max(now, next->when);
      next->done = true;
      next->fire(true);
    }
    now = until;
  }
  int Pending() const {
    return static_cast<int>(std::count_if(timers.begin(), timers.end(), [](const auto& t) { return !t->done; }));
  }

  CoreClock::time_point now = CoreClock::time_point() + std::chrono::hours(1);
  std::vector<std::shared_ptr<Timer>> timers;

 private:
  class Handle final : public PendingCall {
   public:
    explicit Handle(std::shared_ptr<Timer> t) : t_(std::move(t)) {}
    void Cancel() override {
      if (t_->done) return;
      t_->done = true;
      t_->fire(false);
    }

   private:
    std::shared_ptr<Timer> t_;
  };
};

class FakeSink final : public ResponseSink {
 public:
  void Begin(const std::string& request_id) override { begun = request_id; }
  bool Write(v1::GenerateResponse message, bool final) override {
    EXPECT_FALSE(ended) << "a write after the end";
    messages.push_back(std::move(message));
    if (final) ended = true;
    return accept_more;
  }
  void Fail(const absl::Status& status, std::optional<std::chrono::milliseconds> retry) override {
    EXPECT_FALSE(ended) << "a failure after the end";
    ended = true;
    failure = status;
    retry_after = retry;
  }
  std::vector<int32_t> Tokens() const {
    std::vector<int32_t> t;
    for (const auto& m : messages) t.insert(t.end(), m.token_ids().begin(), m.token_ids().end());
    return t;
  }
  const v1::GenerateResponse& Final() const { return messages.back(); }

  std::string begun;
  std::vector<v1::GenerateResponse> messages;
  bool ended = false;
  bool accept_more = true;
  absl::Status failure;
  std::optional<std::chrono::milliseconds> retry_after;
};

}  // namespace tandem::testing
