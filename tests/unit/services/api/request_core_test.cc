// The request core's life cycle against fakes (request_core_fakes.h): every terminal
// path (done, client cancel in each state, deadline, replica failure at each hop,
// migration, prefill retry, an expired lease) ends in kDone with each unused lease
// released exactly once (or left to expire when a prefill may still write into it),
// never a release while a prefill writes, and usage counting every token the client got.
#include "services/api/request_core.h"

#include <gtest/gtest.h>

#include <thread>

#include "engine/tokenizer/byte_level_tokenizer_builder.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/unit/services/api/request_core_fakes.h"

namespace tandem {
namespace {

using testing::FakeClock;
using testing::FakeCluster;
using testing::FakeReplica;
using testing::FakeSink;
using namespace std::chrono_literals;

const Tokenizer& TestTokenizer() {
  static const Tokenizer* tokenizer = [] {
    const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(2000);
    auto t = Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
    EXPECT_TRUE(t.ok()) << t.status();
    return t->release();
  }();
  return *tokenizer;
}

class RequestCoreTest : public ::testing::Test {
 protected:
  RequestCoreTest() {
    config_.vocab_size = 2000;
    config_.max_position_embeddings = 4096;
    ctx_ = RequestCoreContext{.cluster = &cluster_,
                              .clock = &clock_,
                              .tokenizer = &TestTokenizer(),
                              .config = &config_,
                              .model_name = "m",
                              .layout_fingerprint = 7,
                              .max_queue_wait = 1000ms};
    ctx_.on_finished = [this](const RequestSummary& s) { summaries_.push_back(s); };
  }

  void Disaggregated(int decode = 1, int prefill = 1) {
    for (int i = 0; i < decode; ++i) d_.push_back(cluster_.Add(v1::ROLE_DECODE, "d" + std::to_string(i)));
    for (int i = 0; i < prefill; ++i) p_.push_back(cluster_.Add(v1::ROLE_PREFILL, "p" + std::to_string(i)));
  }

  std::shared_ptr<RequestCore> Start(int prompt_tokens = 5, int max_tokens = 16,
                                     std::optional<CoreClock::time_point> deadline = std::nullopt) {
    v1::GenerateRequest r;
    r.set_request_id("r");
    for (int i = 0; i < prompt_tokens; ++i) r.mutable_token_ids()->add_ids(10 + i);
    r.mutable_stop()->set_max_tokens(max_tokens);
    auto core = RequestCore::Create(ctx_, deadline, &sink_);
    core->Start(r);
    return core;
  }

  // The request is over, and nothing broke a lease rule.
  void ExpectDone(const std::shared_ptr<RequestCore>& core) {
    EXPECT_EQ(core->state(), RequestState::kDone);
    EXPECT_TRUE(sink_.ended);
    EXPECT_TRUE(cluster_.ledger.violations.empty()) << ::testing::PrintToString(cluster_.ledger.violations);
    EXPECT_EQ(summaries_.size(), 1u);
    EXPECT_EQ(clock_.Pending(), 0);
  }
  int Releases(const std::string& lease) { return cluster_.ledger.releases[lease]; }
  // The ended writer a lease's release named (0: none, a release without proof).
  uint64_t ReleaseProof(const std::string& lease) { return cluster_.ledger.release_proofs[lease]; }

  ModelInfo config_;
  FakeCluster cluster_;
  FakeClock clock_;
  FakeSink sink_;
  RequestCoreContext ctx_;
  std::vector<RequestSummary> summaries_;
  std::vector<std::shared_ptr<FakeReplica>> d_, p_;
};

TEST(RequestStateTest, IllegalTransitionsAbort) {
  EXPECT_TRUE(IsLegalTransition(RequestState::kReserving, RequestState::kPrefilling));
  EXPECT_FALSE(IsLegalTransition(RequestState::kDone, RequestState::kReserving));
  EXPECT_FALSE(IsLegalTransition(RequestState::kFinishing, RequestState::kFinishing));
  EXPECT_FALSE(IsLegalTransition(RequestState::kQueued, RequestState::kPrefilling));
  EXPECT_FALSE(IsLegalTransition(RequestState::kWaitingForRoom, RequestState::kDecoding));
  EXPECT_DEATH(CheckTransition(RequestState::kDone, RequestState::kReserving), "done -> reserving");
}

TEST_F(RequestCoreTest, HappyPathStreamsEveryTokenAndConsumesTheLease) {
  Disaggregated();
  auto core = Start();
  EXPECT_EQ(sink_.begun, "r");
  ASSERT_EQ(d_[0]->reserves.size(), 1u);
  EXPECT_EQ(d_[0]->reserves[0].req.num_tokens(), 5);
  EXPECT_EQ(core->state(), RequestState::kReserving);
  d_[0]->GrantReserve(0);
  ASSERT_EQ(p_[0]->prefills.size(), 1u);
  EXPECT_EQ(core->state(), RequestState::kPrefilling);
  p_[0]->FirstToken(0, 100);
  ASSERT_EQ(d_[0]->streams.size(), 1u);
  EXPECT_EQ(core->state(), RequestState::kDecoding);
  // The Decode names the writer whose answer proves its writes are done.
  EXPECT_EQ(d_[0]->streams[0]->decode_req.writer_incarnation(), testing::kFakeWriterIncarnation);
  d_[0]->Push(0, {101, 102});
  d_[0]->Push(0, {103}, /*final=*/true);
  EXPECT_EQ(core->state(), RequestState::kFinishing);  // the stream has not ended yet
  d_[0]->End(0, absl::OkStatus());
  ExpectDone(core);
  EXPECT_EQ(sink_.Tokens(), (std::vector<int32_t>{100, 101, 102, 103}));
  EXPECT_EQ(sink_.messages[0].request_id(), "r");
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 4);
  EXPECT_EQ(sink_.Final().usage().prompt_tokens(), 5);
  EXPECT_EQ(Releases("r"), 0);  // the Decode call consumed it
  EXPECT_TRUE(summaries_[0].status.ok());
}

TEST_F(RequestCoreTest, FirstTokenEndsTheRequestAndReleasesTheLeaseOnce) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 1);
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_EQ(ReleaseProof("r"), testing::kFakeWriterIncarnation);  // its answer proves its writes done
  EXPECT_TRUE(d_[0]->streams.empty());
}

TEST_F(RequestCoreTest, InvalidRequestFailsWithoutTouchingReplicas) {
  Disaggregated();
  v1::GenerateRequest r;  // no prompt
  auto core = RequestCore::Create(ctx_, std::nullopt, &sink_);
  core->Start(r);
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(d_[0]->reserves.empty());
}

TEST_F(RequestCoreTest, CancelWhileReservingReleasesALateGrantOnce) {
  Disaggregated();
  auto core = Start();
  core->OnClientGone(absl::CancelledError("cancelled by the client"));
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(d_[0]->reserves[0].call->cancelled);
  EXPECT_EQ(core->state(), RequestState::kFinishing);
  d_[0]->GrantReserve(0);  // raced the cancel
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_TRUE(p_[0]->prefills.empty());
}

TEST_F(RequestCoreTest, CancelledReserveIsReleasedInCaseItReserved) {
  Disaggregated();
  auto core = Start();
  core->OnClientGone(absl::CancelledError("x"));
  d_[0]->FailReserve(0, absl::CancelledError("cancelled"));
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 1);
}

TEST_F(RequestCoreTest, CancelWhileWaitingForRoomEndsTheWait) {
  Disaggregated();
  auto core = Start();
  d_[0]->FailReserve(0, absl::ResourceExhaustedError("full"));
  ASSERT_EQ(d_[0]->reserves.size(), 2u);  // now waiting in the replica's queue
  EXPECT_EQ(core->state(), RequestState::kWaitingForRoom);
  core->OnClientGone(absl::CancelledError("x"));
  EXPECT_TRUE(d_[0]->reserves[1].call->cancelled);
  d_[0]->FailReserve(1, absl::CancelledError("cancelled"));
  ExpectDone(core);
  EXPECT_EQ(d_[0]->waiting, 0);
  EXPECT_EQ(Releases("r#2"), 1);  // a cancelled Reserve may have reserved
}

TEST_F(RequestCoreTest, CancelWhilePrefillingNeverReleasesUnderTheWriterNorWithProof) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  core->OnClientGone(absl::CancelledError("x"));
  EXPECT_TRUE(p_[0]->prefills[0].call->cancelled);
  EXPECT_EQ(core->state(), RequestState::kFinishing);
  EXPECT_EQ(Releases("r"), 0);  // the prefill may still write
  p_[0]->FinishPrefill(0, absl::CancelledError("cancelled"));
  ExpectDone(core);
  // Released once the call ended, without proof: the call ended for the router, the
  // writer may still be copying (the decode replica quarantines until it knows).
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_EQ(ReleaseProof("r"), 0u);
}

TEST_F(RequestCoreTest, CancelWhilePrefillingReleasesOnceThePrefillEnded) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  core->OnClientGone(absl::CancelledError("x"));
  p_[0]->FirstToken(0, 100);  // it had finished before the cancel reached it
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_TRUE(d_[0]->streams.empty());
  EXPECT_EQ(sink_.messages.size(), 0u);
}

TEST_F(RequestCoreTest, CancelWhileDecodingCancelsTheStream) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  d_[0]->Push(0, {101});
  core->OnClientGone(absl::CancelledError("x"));
  EXPECT_TRUE(d_[0]->streams[0]->cancelled);
  d_[0]->End(0, absl::CancelledError("cancelled"));
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 0);
  EXPECT_EQ(summaries_[0].completion_tokens, 2);
}

TEST_F(RequestCoreTest, EventsAfterDoneAreHarmlessAndTheCoreIsFreed) {
  Disaggregated();
  std::weak_ptr<RequestCore> weak;
  {
    auto core = Start();
    weak = core;
    d_[0]->GrantReserve(0);
    p_[0]->FirstToken(0, 100, /*finished=*/true);
    ExpectDone(core);
    core->OnClientGone(absl::CancelledError("late cancel"));
    core->OnSinkReady();
    EXPECT_EQ(core->state(), RequestState::kDone);
  }
  // The fakes still hold their completion callbacks (already run): drop them.
  d_[0]->reserves.clear();
  p_[0]->prefills.clear();
  EXPECT_TRUE(weak.expired());
}

TEST_F(RequestCoreTest, DeadlineDuringPrefillFailsAndReleasesTheLeaseWithoutProof) {
  Disaggregated();
  auto core = Start(5, 16, clock_.now + 500ms);
  d_[0]->GrantReserve(0);
  clock_.Advance(500ms);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(p_[0]->prefills[0].call->cancelled);
  p_[0]->FinishPrefill(0, absl::DeadlineExceededError("deadline"));
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_EQ(ReleaseProof("r"), 0u);
}

// A request that finds the decode replicas full waits in one replica's queue with one
// Reserve: the old router re-sent Reserve every 20 ms (about 50 here).
TEST_F(RequestCoreTest, WaitsForRoomWithOneReserveNotPolling) {
  Disaggregated();
  auto core = Start();
  d_[0]->FailReserve(0, absl::ResourceExhaustedError("full"));
  ASSERT_EQ(d_[0]->reserves.size(), 2u);
  EXPECT_EQ(d_[0]->reserves[0].req.wait_ms(), 0);      // first: at once
  EXPECT_EQ(d_[0]->reserves[1].req.wait_ms(), 1000);   // then: the whole queue wait
  EXPECT_EQ(d_[0]->waiting, 1);
  clock_.Advance(900ms);  // room appears late
  EXPECT_EQ(d_[0]->reserves.size(), 2u);
  d_[0]->GrantReserve(1);
  EXPECT_EQ(d_[0]->waiting, 0);
  EXPECT_EQ(core->state(), RequestState::kPrefilling);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(d_[0]->reserves.size(), 2u);
}

TEST_F(RequestCoreTest, QueuesBehindRequestsAlreadyWaitingWithoutAProbe) {
  Disaggregated();
  d_[0]->waiting = 3;  // three of ours wait there already
  auto core = Start();
  ASSERT_EQ(d_[0]->reserves.size(), 1u);
  EXPECT_EQ(d_[0]->reserves[0].req.wait_ms(), 1000);
  EXPECT_EQ(core->state(), RequestState::kWaitingForRoom);
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(d_[0]->waiting, 3);
}

TEST_F(RequestCoreTest, NoRoomUntilTheQueueWaitRunsOut) {
  Disaggregated();
  auto core = Start();
  // Each wait at the replica ends without room (its own queue was full, say): a pause,
  // then the next attempt waits for what is left of the budget, until nothing is.
  size_t i = 0;
  while (!sink_.ended) {
    ASSERT_LT(i, d_[0]->reserves.size());
    d_[0]->FailReserve(i++, absl::ResourceExhaustedError("full"));
    if (!sink_.ended && d_[0]->reserves.size() == i) {
      clock_.Advance(300ms);  // the wait (or the pause) took this long
    }
  }
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LE(d_[0]->reserves.size(), 10u);
  EXPECT_TRUE(d_[0]->released.empty());
  EXPECT_EQ(d_[0]->waiting, 0);
}

TEST_F(RequestCoreTest, WaitsAtTheReplicaThePolicyPicksAmongFullOnes) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->FailReserve(0, absl::ResourceExhaustedError("full"));
  d_[1]->FailReserve(0, absl::ResourceExhaustedError("full"));
  // Both full: one wait, at the replica the policy picks (the fake: the first).
  ASSERT_EQ(d_[0]->reserves.size(), 2u);
  EXPECT_GT(d_[0]->reserves[1].req.wait_ms(), 0);
  EXPECT_EQ(d_[1]->reserves.size(), 1u);
  d_[0]->FailReserve(1, absl::ResourceExhaustedError("no room within the wait"));
  // After a pause, every replica is looked at again.
  clock_.Advance(RequestCore::kRetryInterval);
  ASSERT_EQ(d_[0]->reserves.size(), 3u);
  EXPECT_EQ(d_[0]->reserves[2].req.wait_ms(), 0);
  d_[0]->FailReserve(2, absl::ResourceExhaustedError("full"));
  ASSERT_EQ(d_[1]->reserves.size(), 2u);
  d_[1]->GrantReserve(1);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
}

TEST_F(RequestCoreTest, FullReplicaSendsTheRequestToTheNext) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->FailReserve(0, absl::ResourceExhaustedError("full"));
  ASSERT_EQ(d_[1]->reserves.size(), 1u);
  EXPECT_EQ(d_[1]->reserves[0].req.request_id(), "r#2");
  d_[1]->GrantReserve(0);
  EXPECT_EQ(p_[0]->prefills[0].req.destination().lease_id(), "r#2");
  EXPECT_EQ(core->state(), RequestState::kPrefilling);
  core->OnClientGone(absl::CancelledError("x"));
  p_[0]->FirstToken(0, 1);
  ExpectDone(core);
  EXPECT_EQ(Releases("r#2"), 1);
}

// A prompt larger than a replica's whole KV pool can never fit there: the request tries
// the other replicas, and when none can hold it fails at once, saying so (no pauses and
// Reserve retries until the deadline).
TEST_F(RequestCoreTest, PromptLargerThanEveryReplicaPoolFailsAtOnce) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->FailReserve(0, absl::OutOfRangeError("5 tokens need 18 KV blocks, more than this replica's whole KV pool"));
  ASSERT_EQ(d_[1]->reserves.size(), 1u);
  d_[1]->FailReserve(0, absl::OutOfRangeError("5 tokens need 18 KV blocks, more than this replica's whole KV pool"));
  ASSERT_TRUE(sink_.ended);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(sink_.failure.message()).find("exceeds the KV capacity"), std::string::npos)
      << sink_.failure;
  EXPECT_EQ(d_[0]->reserves.size(), 1u);
  EXPECT_EQ(d_[1]->reserves.size(), 1u);
  EXPECT_EQ(clock_.Pending(), 0);  // no retry pause
  ExpectDone(core);
}

TEST_F(RequestCoreTest, PromptLargerThanOneReplicaPoolGoesToALargerOne) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->FailReserve(0, absl::OutOfRangeError("more than this replica's whole KV pool"));
  d_[1]->FailReserve(0, absl::ResourceExhaustedError("full"));
  // Only the larger replica is waited at; the small one is never asked again.
  ASSERT_EQ(d_[1]->reserves.size(), 2u);
  EXPECT_GT(d_[1]->reserves[1].req.wait_ms(), 0);
  d_[1]->GrantReserve(1);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_TRUE(sink_.failure.ok());
  EXPECT_EQ(d_[0]->reserves.size(), 1u);
}

TEST_F(RequestCoreTest, DecodeReplicaGoneAtReserveTriesAnother) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->FailReserve(0, absl::UnavailableError("connection refused"));
  d_[1]->GrantReserve(0);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_TRUE(sink_.failure.ok());
}

// The router cancels the calls of a replica it dropped for missing heartbeats: a Reserve
// that ends CANCELLED that way is the replica's failure, not the client's. (Seen in the
// multihost test with a link cut: the request ended CANCELLED instead of going on.)
TEST_F(RequestCoreTest, ReserveCancelledBecauseTheReplicaWasDroppedTriesAnother) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->lost = true;
  d_[0]->FailReserve(0, absl::CancelledError("cancelled: the replica was dropped"));
  ASSERT_EQ(d_[1]->reserves.size(), 1u);
  d_[1]->GrantReserve(0);
  p_[0]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_TRUE(sink_.failure.ok()) << sink_.failure;
}

TEST_F(RequestCoreTest, PrefillReplicaGoneRetriesAnotherOnAFreshLease) {
  // The dead replica may have begun writing into its lease: one writer per lease, so that
  // the Decode's proof (the writer that answered) covers every writer of it.
  Disaggregated(1, /*prefill=*/2);
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FinishPrefill(0, absl::UnavailableError("connection reset"));
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_EQ(ReleaseProof("r"), 0u);
  ASSERT_EQ(d_[0]->reserves.size(), 2u);
  EXPECT_EQ(d_[0]->reserves[1].req.request_id(), "r#2");
  d_[0]->GrantReserve(1);
  ASSERT_EQ(p_[1]->prefills.size(), 1u);
  EXPECT_EQ(p_[1]->prefills[0].req.destination().lease_id(), "r#2");
  p_[1]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(Releases("r#2"), 1);
  EXPECT_EQ(ReleaseProof("r#2"), testing::kFakeWriterIncarnation);
}

TEST_F(RequestCoreTest, PrefillReplicaCutOffAbandonsItsLeaseForAFreshOne) {
  Disaggregated(1, /*prefill=*/2);
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->lost = true;  // dropped for silence: its calls are cancelled, it may still write
  p_[0]->FinishPrefill(0, absl::CancelledError("cancelled"));
  ASSERT_EQ(d_[0]->reserves.size(), 2u);
  EXPECT_EQ(d_[0]->reserves[1].req.request_id(), "r#2");
  d_[0]->GrantReserve(1);
  ASSERT_EQ(p_[1]->prefills.size(), 1u);
  p_[1]->FirstToken(0, 100, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(Releases("r"), 1);  // the cut-off writer's: without proof (quarantined while it may write)
  EXPECT_EQ(ReleaseProof("r"), 0u);
  EXPECT_EQ(Releases("r#2"), 1);
}

TEST_F(RequestCoreTest, FailedTransferStartsOverWithAFreshLease) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FinishPrefill(0, absl::AbortedError("transfer failed"));
  EXPECT_EQ(Releases("r"), 1);
  ASSERT_EQ(d_[0]->reserves.size(), 2u);
  d_[0]->GrantReserve(1);
  p_[0]->FinishPrefill(1, absl::AbortedError("transfer failed"));
  d_[0]->GrantReserve(2);
  p_[0]->FinishPrefill(2, absl::AbortedError("transfer failed"));
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Releases("r"), 1);
  EXPECT_EQ(Releases("r#2"), 1);
  EXPECT_EQ(Releases("r#3"), 1);
}

TEST_F(RequestCoreTest, NoPrefillReplicaLeftReleasesTheLease) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FinishPrefill(0, absl::UnavailableError("gone"));
  EXPECT_EQ(Releases("r"), 1);
  d_[0]->GrantReserve(1);  // the retry's fresh lease, then no prefill replica to write it
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Releases("r#2"), 1);
}

TEST_F(RequestCoreTest, MigrationResumesFromTheTokensSentAndCountsThem) {
  Disaggregated(/*decode=*/2);
  auto core = Start(/*prompt_tokens=*/5);
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  d_[0]->Push(0, {101, 102});
  d_[0]->End(0, absl::UnavailableError("decode replica died"));
  // A fresh lease on the other replica for prompt + the 3 tokens sent.
  ASSERT_EQ(d_[1]->reserves.size(), 1u);
  EXPECT_EQ(d_[1]->reserves[0].req.num_tokens(), 8);
  d_[1]->GrantReserve(0);
  ASSERT_EQ(p_[0]->prefills.size(), 2u);
  const auto& resume = p_[0]->prefills[1].req.resume_tokens();
  EXPECT_EQ(std::vector<int32_t>(resume.begin(), resume.end()), (std::vector<int32_t>{100, 101, 102}));
  p_[0]->FirstToken(1, 103);
  ASSERT_EQ(d_[1]->streams.size(), 1u);
  EXPECT_EQ(d_[1]->streams[0]->decode_req.resume_tokens_size(), 3);
  d_[1]->Push(0, {104}, /*final=*/true);  // the replica counts only its own tokens
  d_[1]->End(0, absl::OkStatus());
  ExpectDone(core);
  EXPECT_EQ(sink_.Tokens(), (std::vector<int32_t>{100, 101, 102, 103, 104}));
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 5);
  EXPECT_EQ(sink_.messages[0].request_id(), "r");
  for (size_t i = 1; i < sink_.messages.size(); ++i) EXPECT_TRUE(sink_.messages[i].request_id().empty());
}

// Speculative decoding: each Decode call carries the hidden state its own prefill answered
// with (after a migration, the re-prefill's: prompt + resume tokens), and the client's usage
// has the draft counts of the replica that decoded.
TEST_F(RequestCoreTest, EachDecodeGetsItsPrefillsHiddenStateAndTheClientTheDraftCounts) {
  Disaggregated(/*decode=*/2);
  auto core = Start(/*prompt_tokens=*/5);
  auto first_token = [](int32_t token, std::vector<float> hidden) {
    v1::PrefillResponse r;
    r.set_first_token(token);
    r.set_kv_bytes(100);
    r.set_writer_incarnation(testing::kFakeWriterIncarnation);
    for (float h : hidden) r.add_mtp_hidden(h);
    return r;
  };
  auto hidden = [](const FakeReplica& d) {
    const auto& h = d.streams.at(0)->decode_req.mtp_hidden();
    return std::vector<float>(h.begin(), h.end());
  };
  d_[0]->GrantReserve(0);
  p_[0]->FinishPrefill(0, first_token(100, {0.5f, -1.0f, 2.0f}));
  ASSERT_EQ(d_[0]->streams.size(), 1u);
  EXPECT_EQ(hidden(*d_[0]), (std::vector<float>{0.5f, -1.0f, 2.0f}));
  d_[0]->Push(0, {101, 102});
  d_[0]->End(0, absl::UnavailableError("decode replica died"));
  d_[1]->GrantReserve(0);
  p_[0]->FinishPrefill(1, first_token(103, {3.0f, 4.0f, 5.0f}));
  ASSERT_EQ(d_[1]->streams.size(), 1u);
  EXPECT_EQ(hidden(*d_[1]), (std::vector<float>{3.0f, 4.0f, 5.0f}));
  v1::Usage drafts;
  drafts.set_draft_tokens(6);
  drafts.set_accepted_draft_tokens(4);
  d_[1]->Push(0, {104}, /*final=*/true, drafts);
  d_[1]->End(0, absl::OkStatus());
  ExpectDone(core);
  EXPECT_EQ(sink_.Final().usage().draft_tokens(), 6);
  EXPECT_EQ(sink_.Final().usage().accepted_draft_tokens(), 4);
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 5);
}

// The old router reported usage.completion_tokens 1 here.
TEST_F(RequestCoreTest, ReprefillWhoseFirstTokenEndsTheRequestCountsResumeTokens) {
  Disaggregated(/*decode=*/2);
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  d_[0]->Push(0, {101, 102, 103});
  d_[0]->End(0, absl::UnavailableError("decode replica died"));
  d_[1]->GrantReserve(0);
  p_[0]->FirstToken(1, 104, /*finished=*/true);
  ExpectDone(core);
  EXPECT_EQ(sink_.Tokens(), (std::vector<int32_t>{100, 101, 102, 103, 104}));
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 5);
  EXPECT_EQ(summaries_[0].completion_tokens, 5);
  EXPECT_EQ(Releases("r#2"), 1);
}

TEST_F(RequestCoreTest, ExpiredLeaseAtDecodeMigratesToTheSameReplica) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  d_[0]->End(0, absl::FailedPreconditionError("no KV reservation for request 'r' (expired or never made)"));
  ASSERT_EQ(d_[0]->reserves.size(), 2u);  // not excluded: it is alive
  d_[0]->GrantReserve(1);
  p_[0]->FirstToken(1, 101);
  d_[0]->Push(1, {102}, /*final=*/true);
  d_[0]->End(1, absl::OkStatus());
  ExpectDone(core);
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 3);
  EXPECT_EQ(summaries_[0].migrations, 1);
}

TEST_F(RequestCoreTest, MigrationsAreBounded) {
  Disaggregated();
  auto core = Start();
  for (int i = 0; i <= RequestCore::kMaxMigrations; ++i) {
    d_[0]->GrantReserve(i);
    p_[0]->FirstToken(i, 100 + i);
    d_[0]->End(i, absl::AbortedError("KV arrived corrupted"));
  }
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kAborted);
}

TEST_F(RequestCoreTest, StreamEndingWithoutFinalMessageIsAnError) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  d_[0]->End(0, absl::OkStatus());
  // INTERNAL migrates (the replica may have lost the request); the second time the
  // replica is the same, so bound it by ending every attempt the same way.
  for (int i = 1; i <= RequestCore::kMaxMigrations; ++i) {
    d_[0]->GrantReserve(i);
    p_[0]->FirstToken(i, 100 + i);
    d_[0]->End(i, absl::OkStatus());
  }
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kInternal);
}

TEST_F(RequestCoreTest, SlowClientStopsTheReadsUntilTheSinkDrains) {
  Disaggregated();
  auto core = Start();
  d_[0]->GrantReserve(0);
  p_[0]->FirstToken(0, 100);
  EXPECT_EQ(d_[0]->streams[0]->reads.load(), 1);
  sink_.accept_more = false;
  d_[0]->Push(0, {101});
  EXPECT_EQ(d_[0]->streams[0]->reads.load(), 0);  // no read until the sink has room
  sink_.accept_more = true;
  core->OnSinkReady();
  EXPECT_EQ(d_[0]->streams[0]->reads.load(), 1);
  d_[0]->Push(0, {102}, /*final=*/true);
  d_[0]->End(0, absl::OkStatus());
  ExpectDone(core);
}

TEST_F(RequestCoreTest, AggregatedWorkersGetTheRequestAsIs) {
  auto w = cluster_.Add(v1::ROLE_BOTH, "w0");
  auto core = Start();
  ASSERT_EQ(w->streams.size(), 1u);
  EXPECT_EQ(w->streams[0]->generate_req.request_id(), "r");
  w->Push(0, {100});
  w->Push(0, {101}, /*final=*/true);
  w->End(0, absl::OkStatus());
  ExpectDone(core);
  EXPECT_EQ(sink_.Final().usage().completion_tokens(), 2);
}

TEST_F(RequestCoreTest, NoReplicasIsUnavailable) {
  auto core = Start();
  ExpectDone(core);
  EXPECT_EQ(sink_.failure.code(), absl::StatusCode::kUnavailable);
}

// Completions, cancels and sink events from several threads at once: the handlers are
// serialized (run under ThreadSanitizer, this is where a race would show).
TEST_F(RequestCoreTest, ConcurrentEventsAreSerialized) {
  for (int round = 0; round < 200; ++round) {
    FakeCluster cluster;
    auto d = cluster.Add(v1::ROLE_DECODE, "d");
    auto p = cluster.Add(v1::ROLE_PREFILL, "p");
    RequestCoreContext ctx = ctx_;
    ctx.cluster = &cluster;
    ctx.on_finished = nullptr;
    FakeSink sink;
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(10);
    auto core = RequestCore::Create(ctx, std::nullopt, &sink);
    core->Start(r);
    d->GrantReserve(0);
    p->FirstToken(0, 100);
    std::thread a([&] { d->Push(0, {101}); });
    std::thread b([&] { core->OnClientGone(absl::CancelledError("x")); });
    std::thread c([&] { core->OnSinkReady(); });
    a.join();
    b.join();
    c.join();
    EXPECT_EQ(core->state(), RequestState::kFinishing);
    d->End(0, absl::CancelledError("x"));
    EXPECT_EQ(core->state(), RequestState::kDone);
    EXPECT_TRUE(sink.ended);
  }
}

}  // namespace
}  // namespace tandem
