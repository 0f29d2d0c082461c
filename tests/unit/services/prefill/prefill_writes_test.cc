// The prefill replica's writes into a lease (prefill_service.h, kv_writer_session.h): on
// every way out of a Prefill call it announced itself before its first write
// (Decode.BeginWrites answered OK), and told the decode replica its writes ended
// (Decode.EndWrites) after the last one completed and before the call answered. A real
// engine (tiny model) and gRPC server; a fake transport whose flushes complete when the
// test says, and fake decode notices; one event log to check the order.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "services/prefill/prefill_service.h"
#include "tandem/v1/internal.grpc.pb.h"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

using testing::Tokens;

// What happened, in order, from every thread.
class EventLog {
 public:
  void Add(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  std::vector<std::string> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // Waits (on the others' progress, no clock bound) until `e` was logged.
  void Await(const std::string& e) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return std::find(events_.begin(), events_.end(), e) != events_.end(); });
  }
  int Count(const std::string& e) const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count(events_.begin(), events_.end(), e));
  }
  // Position of the first (or last) `e`; -1 when absent.
  int First(const std::string& e) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(events_.begin(), events_.end(), e);
    return it == events_.end() ? -1 : static_cast<int>(it - events_.begin());
  }
  int Last(const std::string& e) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(events_.rbegin(), events_.rend(), e);
    return it == events_.rend() ? -1 : static_cast<int>(events_.rend() - it - 1);
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

// A transport whose puts are logged and whose flushes complete at once, or when the test
// releases them (from another thread, as a transport thread would).
class FakeTransport final : public KvTransport {
 public:
  explicit FakeTransport(EventLog* log) : log_(log) {}

  class Session final : public KvWriteSession {
   public:
    Session(FakeTransport* t) : t_(t) {}
    absl::Status Put(const void*, size_t, uint64_t) override {
      if (t_->puts_before_error >= 0 && t_->puts_ok_ >= t_->puts_before_error) {
        return absl::UnavailableError("peer gone");
      }
      ++t_->puts_ok_;
      t_->log_->Add("put");
      return absl::OkStatus();
    }
    void Commit() override {}
    void Flush(std::function<void(absl::Status)> done) override {
      std::unique_lock<std::mutex> lock(t_->mu_);
      if (!t_->hold_flush) {
        lock.unlock();
        t_->log_->Add("flushed");
        done(absl::OkStatus());
        return;
      }
      t_->held_ = std::move(done);
      t_->log_->Add("flush held");
    }

   private:
    FakeTransport* t_;
  };

  absl::StatusOr<Pool> AllocatePool(size_t) override { return absl::UnimplementedError("prefill side only"); }
  absl::StatusOr<std::unique_ptr<KvWriteSession>> OpenSession(const std::string&,
                                                              std::chrono::steady_clock::time_point) override {
    return std::make_unique<Session>(this);
  }
  std::string name() const override { return "fake"; }

  // Completes the held flush on another thread.
  void ReleaseFlush() {
    std::function<void(absl::Status)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(held_);
    }
    ASSERT_TRUE(done);
    std::thread([this, done] {
      log_->Add("flushed");
      done(absl::OkStatus());
    }).join();
  }

  bool hold_flush = false;
  int puts_before_error = -1;  // >= 0: puts after this many fail
  int puts_ok_ = 0;

 private:
  EventLog* log_;
  std::mutex mu_;
  std::function<void(absl::Status)> held_;
};

// The decode replica's side of the notices: BeginWrites answered at once (OK or refused)
// or when the test says.
class FakeNotices final : public KvWriteNotices {
 public:
  enum class Mode { kAccept, kRefuse, kHold };
  explicit FakeNotices(EventLog* log) : log_(log) {}

  void BeginWrites(const std::string& address, const v1::BeginWritesRequest& r, std::chrono::steady_clock::time_point,
                   std::function<void(absl::Status)> done) override {
    log_->Add("begin");
    {
      std::lock_guard<std::mutex> lock(mu_);
      begins.push_back(r);
      addresses.push_back(address);
      if (mode == Mode::kHold) {
        held_ = std::move(done);
        return;
      }
    }
    if (mode == Mode::kAccept) {
      log_->Add("begin ok");
      done(absl::OkStatus());
    } else {
      log_->Add("begin refused");
      done(absl::FailedPreconditionError("lease not live"));
    }
  }
  void EndWrites(const std::string&, const v1::EndWritesRequest& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    ends.push_back(r);
    log_->Add("end");
  }
  // Accepts the held BeginWrites on another thread.
  void AcceptHeld() {
    std::function<void(absl::Status)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(held_);
    }
    ASSERT_TRUE(done);
    std::thread([this, done] {
      log_->Add("begin ok");
      done(absl::OkStatus());
    }).join();
  }

  Mode mode = Mode::kAccept;
  std::mutex mu_;
  std::vector<v1::BeginWritesRequest> begins;
  std::vector<std::string> addresses;
  std::vector<v1::EndWritesRequest> ends;

 private:
  EventLog* log_;
  std::function<void(absl::Status)> held_;
};

constexpr uint64_t kToken = 0x1234;
constexpr char kDecodeAddress[] = "decode.test:7000";
constexpr char kWriterAddress[] = "prefill.test:7001";

class PrefillWritesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.num_threads = 1;
    auto e = Engine::Create(testing::SmallTinyModelDir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() { delete engine_; }

  void SetUp() override {
    notices_ = std::make_shared<FakeNotices>(&log_);
    service_ = std::make_unique<PrefillServiceImpl>(engine_, &transport_, notices_);
    service_->SetAddress(kWriterAddress);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = v1::Prefill::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    server_.reset();
  }

  v1::PrefillRequest Request(const std::string& id, int prompt_tokens) const {
    const Engine::KvMemory m = engine_->kv_memory();
    constexpr int64_t kPoolBlocks = 8;
    v1::PrefillRequest r;
    r.set_request_id(id);
    for (int32_t t : Tokens(prompt_tokens, 3)) r.add_prompt(t);
    r.mutable_stop()->set_max_tokens(4);
    v1::KvDestination* d = r.mutable_destination();
    d->set_layout_fingerprint(engine_->layout_fingerprint());
    transfer::RemoteMemoryDescriptor desc{.transport = "fake", .engine_address = "fake", .base = 0,
                                          .length = static_cast<uint64_t>(m.num_layers * kPoolBlocks * m.block_size *
                                                                          m.entry_dim * sizeof(float)),
                                          .rkey = "k"};
    d->set_memory_descriptor(desc.Serialize());
    d->set_num_blocks(kPoolBlocks);
    d->set_block_size(static_cast<int32_t>(m.block_size));
    d->set_entry_dim(static_cast<int32_t>(m.entry_dim));
    d->set_num_layers(static_cast<int32_t>(m.num_layers));
    d->set_bytes_per_value(sizeof(float));
    const int64_t blocks = (prompt_tokens + 1 + m.block_size - 1) / m.block_size;
    for (int64_t b = 0; b < blocks; ++b) d->add_block_ids(static_cast<int32_t>(kPoolBlocks - 1 - b));
    d->set_lease_id(id);
    d->set_lease_ms(30000);
    d->set_decode_address(kDecodeAddress);
    d->set_lease_token(kToken);
    return r;
  }

  // Runs the call on its own thread; the future's value is its status (and response).
  struct Answer {
    grpc::Status status;
    v1::PrefillResponse response;
  };
  std::future<Answer> Call(v1::PrefillRequest r, grpc::ClientContext* ctx) {
    return std::async(std::launch::async, [this, r = std::move(r), ctx] {
      Answer a;
      a.status = stub_->Prefill(ctx, r, &a.response);
      log_.Add("answer");
      return a;
    });
  }
  Answer CallNow(v1::PrefillRequest r) {
    grpc::ClientContext ctx;
    return Call(std::move(r), &ctx).get();
  }

  bool WriterStateSaysWriting(const std::string& id) {
    grpc::ClientContext ctx;
    v1::WriterStateRequest q;
    v1::LeaseRef* l = q.add_leases();
    l->set_lease_id(id);
    l->set_lease_token(kToken);
    v1::WriterStateResponse a;
    EXPECT_TRUE(stub_->WriterState(&ctx, q, &a).ok());
    EXPECT_EQ(a.incarnation(), service_->incarnation());
    return a.writing_size() == 1;
  }

  // The rules every call must keep, whatever its way out.
  void ExpectWritesAnnouncedAndEndedInOrder() {
    const std::vector<std::string> ev = log_.events();
    SCOPED_TRACE(::testing::PrintToString(ev));
    EXPECT_EQ(log_.Count("begin"), 1);
    EXPECT_EQ(log_.Count("end"), 1) << "every call that announced its writes ends them";
    EXPECT_EQ(log_.Count("answer"), 1);
    if (log_.Count("put") > 0) {
      ASSERT_GE(log_.First("begin ok"), 0) << "a put without an accepted BeginWrites";
      EXPECT_LT(log_.First("begin ok"), log_.First("put")) << "a put before the decode replica recorded the writer";
      EXPECT_LT(log_.Last("put"), log_.Last("flushed"));
      EXPECT_LT(log_.Last("flushed"), log_.First("end")) << "EndWrites before the writes completed";
    }
    EXPECT_LT(log_.First("end"), log_.First("answer")) << "the call answered before EndWrites";
    EXPECT_EQ(service_->writers().size(), 0u);
  }

  static Engine* engine_;
  EventLog log_;
  FakeTransport transport_{&log_};
  std::shared_ptr<FakeNotices> notices_;
  std::unique_ptr<PrefillServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Prefill::Stub> stub_;
};
Engine* PrefillWritesTest::engine_ = nullptr;

TEST_F(PrefillWritesTest, AnAnsweredPrefillAnnouncedItsWritesAndEndedThemBeforeAnswering) {
  Answer a = CallNow(Request("ok", 100));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_GT(log_.Count("put"), 0);
  EXPECT_EQ(a.response.writer_incarnation(), service_->incarnation());
  ExpectWritesAnnouncedAndEndedInOrder();
  ASSERT_EQ(notices_->begins.size(), 1u);
  EXPECT_EQ(notices_->addresses[0], kDecodeAddress);
  EXPECT_EQ(notices_->begins[0].lease().lease_id(), "ok");
  EXPECT_EQ(notices_->begins[0].lease().lease_token(), kToken);
  EXPECT_EQ(notices_->begins[0].writer_address(), kWriterAddress);
  EXPECT_EQ(notices_->begins[0].writer_incarnation(), service_->incarnation());
  ASSERT_EQ(notices_->ends.size(), 1u);
  EXPECT_EQ(notices_->ends[0].lease().lease_id(), "ok");
  EXPECT_EQ(notices_->ends[0].writer_incarnation(), service_->incarnation());
}

TEST_F(PrefillWritesTest, LayersComputedBeforeTheAnswerToBeginWritesWaitForIt) {
  notices_->mode = FakeNotices::Mode::kHold;
  const int64_t finished_before = engine_->Stats().requests_finished;
  grpc::ClientContext ctx;
  std::future<Answer> f = Call(Request("late", 100), &ctx);
  log_.Await("begin");
  // The engine computes every layer meanwhile (the prefill-only request ends in the
  // engine); nothing is put.
  while (engine_->Stats().requests_finished == finished_before) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(log_.Count("put"), 0);
  EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  notices_->AcceptHeld();
  Answer a = f.get();
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_GT(log_.Count("put"), 0);
  ExpectWritesAnnouncedAndEndedInOrder();
}

TEST_F(PrefillWritesTest, ARefusedBeginWritesWritesNothingAndAbortsTheCall) {
  notices_->mode = FakeNotices::Mode::kRefuse;
  Answer a = CallNow(Request("refused", 100));
  // ABORTED: the router starts over on a fresh lease.
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::ABORTED) << a.status.error_message();
  EXPECT_EQ(log_.Count("put"), 0);
  ExpectWritesAnnouncedAndEndedInOrder();
}

TEST_F(PrefillWritesTest, ACancelledCallEndsItsWritesOnlyOnceTheyCompleted) {
  transport_.hold_flush = true;
  grpc::ClientContext ctx;
  std::future<Answer> f = Call(Request("cancel", 100), &ctx);
  log_.Await("flush held");
  // The writer still holds writes: its process says so when asked.
  EXPECT_TRUE(WriterStateSaysWriting("cancel"));
  ctx.TryCancel();
  // The client's call ends at once; the handler's does not, until the writes completed.
  EXPECT_EQ(f.get().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(log_.Count("end"), 0) << "EndWrites while a put may still be in flight";
  EXPECT_TRUE(WriterStateSaysWriting("cancel"));
  transport_.ReleaseFlush();
  log_.Await("end");
  EXPECT_LT(log_.Last("flushed"), log_.First("end"));
  EXPECT_FALSE(WriterStateSaysWriting("cancel"));
  EXPECT_EQ(log_.Count("begin"), 1);
  EXPECT_EQ(log_.Count("end"), 1);
}

TEST_F(PrefillWritesTest, AFailedTransferCompletesWhatWasQueuedThenEnds) {
  transport_.puts_before_error = 3;  // a few layers' puts are queued, then the peer fails
  Answer a = CallNow(Request("fail", 100));
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::ABORTED) << a.status.error_message();
  EXPECT_EQ(log_.Count("put"), 3);
  ExpectWritesAnnouncedAndEndedInOrder();
}

TEST_F(PrefillWritesTest, ARequestTheEngineRefusesEndsItsWritesToo) {
  v1::PrefillRequest r = Request("bad-token", 100);
  r.set_prompt(5, 1 << 20);  // outside the vocabulary: refused by the engine, after the announcement
  Answer a = CallNow(r);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << a.status.error_message();
  EXPECT_EQ(log_.Count("put"), 0);
  ExpectWritesAnnouncedAndEndedInOrder();
}

TEST_F(PrefillWritesTest, ACallRefusedBeforeItsAnnouncementSendsNeither) {
  v1::PrefillRequest r = Request("no-lease", 100);
  r.mutable_destination()->set_lease_ms(0);  // checked before anything is announced
  Answer a = CallNow(r);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(log_.Count("begin"), 0);
  EXPECT_EQ(log_.Count("end"), 0);
}

TEST_F(PrefillWritesTest, WriterStateNamesOnlyTheLeasesACallHolds) {
  EXPECT_FALSE(WriterStateSaysWriting("never"));
  ASSERT_TRUE(CallNow(Request("done", 100)).status.ok());
  EXPECT_FALSE(WriterStateSaysWriting("done"));
}

}  // namespace
}  // namespace tandem
