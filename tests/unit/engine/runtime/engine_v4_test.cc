// DeepSeek-V4 through the engine on the CPU: requests batched together, their prompts
// prefilled in chunks that cut across windows and blocks, preempted and recomputed when
// the KV pool runs short, each give exactly the greedy continuation of the model run
// alone; a prompt's KV exported by one engine and imported by another continues exactly;
// a prefix-cache hit gives the logits of a full prefill; what the engine cannot do for V4
// (layer-by-layer export) is refused clearly. Prefix imports: engine_v4_prefix_import_test.
#include <cstring>
#include <future>
#include <map>
#include <set>

#include "engine/model/deepseek_v4/v4_model.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/model/deepseek_v4/v4_test_models.h"
#include "tests/unit/engine/runtime/engine_test_support.h"
#include "tests/unit/engine/runtime/engine_v4_test_support.h"

namespace tandem {
namespace {

using testing::Drain;
using testing::GreedyRequest;
using testing::ModelGreedy;
using testing::ReserveWithToken;
using testing::Prompt;
using testing::Result;
using testing::RunScored;
using testing::Scored;
using testing::StagingSink;
using testing::V4Dir;

class EngineV4Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<v4::DeepseekV4Model>> m = v4::DeepseekV4Model::Load(V4Dir(), {.num_threads = 2});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() { delete model_; }

  // Runs every prompt at once and checks each output against the model alone.
  void ExpectGreedyOutputs(EngineOptions o, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    o.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    testing::ExpectGreedyOutputs(**e, *model_, prompts, max_tokens);
    stats_ = (*e)->Stats();
  }

  static v4::DeepseekV4Model* model_;
  EngineStats stats_;
};
v4::DeepseekV4Model* EngineV4Test::model_ = nullptr;

TEST_F(EngineV4Test, BatchedChunkedRequestsGiveTheModelsGreedyContinuation) {
  // tiny-v4: a 16-token window, CSA windows of 4, HCA windows of 16; 40-token steps cut
  // every prompt's prefill across all of them and across 64-token blocks.
  ExpectGreedyOutputs({.max_batch_tokens = 40}, {Prompt(5, 1), Prompt(37, 2), Prompt(130, 3), Prompt(201, 4)}, 24);
  EXPECT_EQ(stats_.preemptions, 0);
}

TEST_F(EngineV4Test, PreemptedRequestsRecomputeExactly) {
  // Six blocks for four sequences that need two to four each: some are preempted, their
  // slots and blocks go to others, and they start again from their tokens.
  ExpectGreedyOutputs({.num_kv_blocks = 6, .max_batch_tokens = 64},
                      {Prompt(100, 5), Prompt(90, 6), Prompt(120, 7), Prompt(60, 8)}, 40);
  EXPECT_GT(stats_.preemptions, 0);
}

TEST_F(EngineV4Test, PrefillExportAndDecodeImportContinueTheGreedyRunExactly) {
  // A prefill engine that chunks prompts across windows and blocks; a decode engine whose
  // reservations land in other blocks and slots than the prefill's (a prior reservation
  // shifts them). Prompt, reserved, and the decode engine going on from the first token.
  absl::StatusOr<std::unique_ptr<Engine>> p = Engine::Create(V4Dir(), {.num_threads = 2, .max_batch_tokens = 40});
  absl::StatusOr<std::unique_ptr<Engine>> d = Engine::Create(V4Dir(), {.num_threads = 2});
  ASSERT_TRUE(p.ok() && d.ok());
  EXPECT_EQ((*d)->kv_entry_dim(), 0);
  EXPECT_GT((*d)->kv_memory().num_state_slots, 0);
  const KvLeases::Reservation shift = ReserveWithToken(**d, "shift", 70);
  EXPECT_GE(shift.state_slot, 0);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, 11), Prompt(37, 12), Prompt(130, 13), Prompt(201, 14)};
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << prompts[i].size() << " tokens");
    const std::vector<int32_t> expected = ModelGreedy(*model_, prompts[i], 20);
    const std::string id = "q" + std::to_string(i);
    StagingSink sink;
    EngineRequest pre = GreedyRequest(id, prompts[i], 1);
    pre.kv_sink = &sink;
    absl::StatusOr<std::shared_ptr<OutputStream>> ps = (*p)->Submit(std::move(pre));
    ASSERT_TRUE(ps.ok()) << ps.status();
    const Result first = Drain(**ps);
    ASSERT_TRUE(first.final.status.ok()) << first.final.status;
    ASSERT_EQ(first.tokens.size(), 1u);
    EXPECT_EQ(first.tokens[0], expected[0]);
    EXPECT_EQ(sink.calls, 1);
    EXPECT_EQ(sink.num_tokens, static_cast<int64_t>(prompts[i].size()));

    const KvLeases::Reservation r = ReserveWithToken(**d, id, static_cast<int32_t>(prompts[i].size()));
    ASSERT_GE(r.state_slot, 0);
    sink.WriteInto(**d, r);
    absl::StatusOr<std::shared_ptr<OutputStream>> ds =
        (*d)->SubmitImported(GreedyRequest(id, prompts[i], 20), first.tokens[0]);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const Result decoded = Drain(**ds);
    ASSERT_TRUE(decoded.final.status.ok()) << decoded.final.status;
    EXPECT_EQ(decoded.tokens, expected);
  }
  (*d)->Cancel("shift");
}

// A prefix-cache hit takes the cached blocks (the compressed entries and indexer keys)
// and the snapshot of the window ring and compressor states where the prefix ends: every
// logprob of what follows is bitwise that of a full prefill, for a prompt extending the
// cached one and for the same prompt again. Also with HCA windows of 128, longer than a
// 64-token block, so that the snapshot holds a half-pooled window.
TEST_F(EngineV4Test, APrefixCacheHitGivesTheLogitsOfAFullPrefill) {
  static testing::TempDir* tmp = new testing::TempDir();
  nlohmann::json long_hca = v4::testing::TinyV4Json(512);
  long_hca["compress_rates"]["heavily_compressed_attention"] = 128;
  const std::string long_hca_dir = v4::testing::MakeV4Model(*tmp, "tiny-v4-hca128", long_hca.dump());
  for (const std::string& dir : {V4Dir(), long_hca_dir}) {
    SCOPED_TRACE(dir);
    const std::vector<int32_t> first = Prompt(150, 9);
    std::vector<int32_t> second = first;
    for (int32_t t : Prompt(50, 10)) second.push_back(t);

    EngineOptions cold;
    cold.num_threads = 2;
    cold.enable_prefix_cache = false;
    absl::StatusOr<std::unique_ptr<Engine>> ref = Engine::Create(dir, cold);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const Scored want_second = RunScored(**ref, "ref2", second, 12);
    const Scored want_first = RunScored(**ref, "ref1", first, 12);
    EXPECT_EQ(want_second.metrics.cached_prompt_tokens, 0);

    EngineOptions warm;
    warm.num_threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(dir, warm);
    ASSERT_TRUE(e.ok()) << e.status();
    const Scored a = RunScored(**e, "a", first, 12);
    EXPECT_EQ(a.metrics.cached_prompt_tokens, 0);
    const Scored b = RunScored(**e, "b", second, 12);  // its first two blocks are cached
    const Scored c = RunScored(**e, "c", first, 12);   // the same prompt again
    EXPECT_EQ(b.metrics.cached_prompt_tokens, 128);
    EXPECT_EQ(c.metrics.cached_prompt_tokens, 128);
    EXPECT_EQ(b.metrics.computed_prompt_tokens, 200 - 128);
    EXPECT_EQ(a.tokens, want_first.tokens);
    EXPECT_EQ(a.logprobs, want_first.logprobs);
    EXPECT_EQ(b.tokens, want_second.tokens);
    EXPECT_EQ(b.logprobs, want_second.logprobs);
    EXPECT_EQ(c.tokens, want_first.tokens);
    EXPECT_EQ(c.logprobs, want_first.logprobs);
    ASSERT_EQ(b.logprobs.size(), 12u);
    const EngineStats st = (*e)->Stats();
    EXPECT_EQ(st.prefix_cache_hit_blocks, 4);
    EXPECT_EQ(st.prefix_state_snapshots, 2);  // at 128 for `first`, at 192 for `second`
  }
}

// A shared "system prompt" of 150 tokens (two full blocks) before each request's own 60:
// the first request's snapshot ends inside its own text, the second one's where the shared
// blocks end, and the third reuses those 128 tokens, logprobs bitwise as a full prefill's.
TEST_F(EngineV4Test, ASharedSystemPromptIsReusedFromTheThirdRequestOn) {
  const std::vector<int32_t> system = Prompt(150, 21);
  std::vector<std::vector<int32_t>> prompts;
  for (int u = 0; u < 3; ++u) {
    prompts.push_back(system);
    for (int32_t t : Prompt(60, 30 + u)) prompts.back().push_back(t);
  }
  EngineOptions cold;
  cold.num_threads = 2;
  cold.enable_prefix_cache = false;
  absl::StatusOr<std::unique_ptr<Engine>> ref = Engine::Create(V4Dir(), cold);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EngineOptions warm;
  warm.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), warm);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int32_t> cached;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = "u" + std::to_string(i);
    const Scored want = RunScored(**ref, id, prompts[i], 8);
    const Scored got = RunScored(**e, id, prompts[i], 8);
    EXPECT_EQ(got.tokens, want.tokens) << id;
    EXPECT_EQ(got.logprobs, want.logprobs) << id;
    cached.push_back(got.metrics.cached_prompt_tokens);
  }
  EXPECT_EQ(cached, (std::vector<int32_t>{0, 0, 128}));
}

// A conversation's next turn: the first turn's prompt (100 tokens) and its 80-token answer,
// then new text. Its KV up to the answer's last full block (128) comes from the cache, the
// state from the snapshot the first turn took while decoding; logprobs bitwise as cold.
TEST_F(EngineV4Test, TheNextTurnReusesTheAnswerToo) {
  EngineOptions warm;
  warm.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), warm);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<int32_t> turn1 = Prompt(100, 41);
  const Scored answer = RunScored(**e, "t1", turn1, 80);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), answer.tokens.begin(), answer.tokens.end());
  for (int32_t t : Prompt(30, 42)) turn2.push_back(t);
  const Scored got = RunScored(**e, "t2", turn2, 8);
  EXPECT_EQ(got.metrics.cached_prompt_tokens, 128);  // (the prompt's own snapshot: 64)

  EngineOptions cold;
  cold.num_threads = 2;
  cold.enable_prefix_cache = false;
  absl::StatusOr<std::unique_ptr<Engine>> ref = Engine::Create(V4Dir(), cold);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Scored want = RunScored(**ref, "t2", turn2, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logprobs, want.logprobs);

  // Off: the prompt's snapshot only.
  warm.decode_state_snapshots = false;
  absl::StatusOr<std::unique_ptr<Engine>> off = Engine::Create(V4Dir(), warm);
  ASSERT_TRUE(off.ok()) << off.status();
  RunScored(**off, "t1", turn1, 80);
  EXPECT_EQ(RunScored(**off, "t2", turn2, 8).metrics.cached_prompt_tokens, 64);
}

TEST_F(EngineV4Test, AKvCacheBudgetTooSmallForTheSlotsIsAClearError) {
  EngineOptions o;
  o.num_threads = 1;
  o.kv_cache_bytes = 64 << 10;  // below 3 x 64 slots of tiny-v4's ~39 KB state
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_NE(e.status().message().find("--kv-cache-mb"), std::string::npos) << e.status();
  o.prefix_state_snapshots = 0;
  o.max_running = 1;
  o.kv_cache_bytes = 8 << 20;  // two slots and many blocks
  EXPECT_TRUE(Engine::Create(V4Dir(), o).ok());
}

TEST_F(EngineV4Test, NoSnapshotsMeansNoPrefixCache) {
  EngineOptions o;
  o.num_threads = 2;
  o.prefix_state_snapshots = 0;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->kv_memory().num_state_slots, 2 * o.max_running);
  RunScored(**e, "a", Prompt(150, 9), 2);
  const Scored b = RunScored(**e, "b", Prompt(150, 9), 2);
  EXPECT_EQ(b.metrics.cached_prompt_tokens, 0);
  EXPECT_EQ((*e)->Stats().prefix_state_snapshots, 0);
}

TEST_F(EngineV4Test, ReservationsHoldSequenceSlotsAndGiveThemBack) {
  // max_running 2: four slots; four reservations take them all, a fifth waits for one.
  // (The pool has two more, the prefix cache's state snapshots.)
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), {.num_threads = 2, .max_running = 2});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->kv_memory().num_state_slots, 4 + 2);
  std::set<int32_t> slots;
  for (int i = 0; i < 4; ++i) slots.insert(ReserveWithToken(**e, "r" + std::to_string(i), 10).state_slot);
  EXPECT_EQ(slots, (std::set<int32_t>{0, 1, 2, 3}));
  absl::StatusOr<std::vector<int32_t>> more = (*e)->ReserveKv("r4", 10);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_NE(more.status().message().find("sequence slot"), std::string::npos) << more.status();
  (*e)->Cancel("r1");
  // (Cancel is posted to the engine thread; the reservation after it sees the slot free.)
  EXPECT_EQ(ReserveWithToken(**e, "r5", 10).state_slot, 1);
  // A request still runs beside them once they end (a waiting one needs a free slot).
  for (const char* id : {"r0", "r2", "r3", "r5"}) (*e)->Cancel(id);
  absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(GreedyRequest("after", Prompt(20, 9), 4));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Drain(**s).tokens, ModelGreedy(*model_, Prompt(20, 9), 4));
}

TEST_F(EngineV4Test, KvMemoryGivenHoldsTheSlotsAndAsManyBlocksAsFit) {
  // A decode replica's pool lives in memory the transport allocated: exactly what seven
  // blocks and the slots (2 x 3 running, 3 snapshots) take gives seven blocks, a byte less six.
  absl::StatusOr<std::unique_ptr<Engine>> probe = Engine::Create(V4Dir(), {.num_threads = 1, .max_running = 3});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const KvLayout& layout = (*probe)->kv_layout();
  absl::StatusOr<size_t> seven = KvPool::BytesFor(layout.streams, {.num_layers = layout.num_layers,
                                                                   .block_size = layout.block_size, .num_blocks = 7,
                                                                   .num_sequence_slots = 9});
  ASSERT_TRUE(seven.ok()) << seven.status();
  for (const size_t bytes : {*seven, *seven - 1}) {
    std::vector<float> memory(bytes / sizeof(float) + 1);
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(
        V4Dir(), {.num_threads = 1, .kv_memory = memory.data(), .kv_memory_bytes = bytes, .max_running = 3});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->kv_memory().num_blocks, bytes == *seven ? 7 : 6) << bytes << " bytes";
    EXPECT_EQ((*e)->kv_memory().num_state_slots, 9);
    EXPECT_LE((*e)->kv_memory().bytes, bytes);
  }
}

TEST_F(EngineV4Test, LayerByLayerExportIsRefusedNamingTheModel) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), {.num_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status();
  class LayerSink : public KvSink {
   public:
    void OnLayerKv(const KvSlice&) override {}
  } sink;
  EngineRequest r = GreedyRequest("x", Prompt(10, 1), 1);
  r.kv_sink = &sink;
  absl::StatusOr<std::shared_ptr<OutputStream>> s = (*e)->Submit(std::move(r));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("deepseek_v4"), std::string::npos) << s.status();
  EXPECT_EQ((*e)->config().model_type, "deepseek_v4");
  EXPECT_NE((*e)->config().summary.find("deepseek_v4"), std::string::npos) << (*e)->config().summary;
  EXPECT_EQ((*e)->kv_layout().streams.size(), 7u);
}

TEST_F(EngineV4Test, ACudaDeviceWithoutAGpuIsAClearError) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU (engine_runtime_engine_v4_cuda_test runs there)";
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(V4Dir(), {.device = "cuda"});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("--device cuda"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace tandem
