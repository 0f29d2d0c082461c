// The scheduler under data-parallel attention (docs/parallel.md): one block manager per
// rank. A sequence is placed on the rank that would hold the fewest blocks once it is in
// (a cached prefix there counting as blocks it need not take), its blocks come from that
// rank's pool only, a prefix is shared only within a pool, and a sequence short of blocks
// preempts only sequences of its own rank. Blocks of 4 tokens keep the positions readable.
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/scheduler_test_support.h"

namespace tandem {
namespace {

using testing::Seq;

constexpr int32_t kBlock = 4;

SchedulerOptions Options(int32_t ranks) {
  return {.block_size = kBlock, .max_batch_tokens = 100, .max_running = 8, .enable_prefix_cache = true,
          .layout_fingerprint = 42, .data_parallel_ranks = ranks};
}

// One step; each sequence whose chunk reached its end gets a next token. Returns the plan's
// preemptions.
int32_t Step(Scheduler& s) {
  StepPlan plan = s.Schedule();
  EXPECT_TRUE(plan.rejected.empty());
  s.OnStepComputed(plan);
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.reaches_end()) continue;
    c.seq->tokens.push_back(1000);
    s.OnTokenAppended(*c.seq);
  }
  return plan.num_preempted;
}

// Every running sequence's blocks are held in its own rank's pool, and each pool's blocks in
// use are exactly its sequences' (no sequence shares here).
void ExpectPoolsHoldOnlyTheirSequences(Scheduler& s, const std::vector<std::string>& ids) {
  std::vector<int32_t> held(static_cast<size_t>(s.num_pools()), 0);
  for (const std::string& id : ids) {
    const Sequence* q = s.Find(id);
    if (q == nullptr || q->state != SequenceState::kRunning) continue;
    for (int32_t b : q->blocks) EXPECT_EQ(s.pool(q->dp_rank).ref_count(b), 1) << id << " block " << b;
    held[q->dp_rank] += static_cast<int32_t>(q->blocks.size());
  }
  for (int32_t r = 0; r < s.num_pools(); ++r) {
    EXPECT_EQ(s.pool(r).num_in_use(), held[r]) << "rank " << r;
    s.pool(r).CheckInvariants();
  }
}

TEST(SchedulerDataParallelTest, SequencesGoToTheLeastLoadedRankAndTakeBlocksThereOnly) {
  Scheduler s(Options(3), /*num_blocks=*/16);
  // A long prompt first: 5 blocks on rank 0; the short ones fill ranks 1 and 2 first.
  s.Add(Seq("long", 20));
  for (int i = 0; i < 5; ++i) s.Add(Seq("s" + std::to_string(i), 6, 100 * (i + 1)));
  Step(s);
  std::vector<int32_t> ranks;
  for (const char* id : {"long", "s0", "s1", "s2", "s3", "s4"}) ranks.push_back(s.Find(id)->dp_rank);
  // Blocks in use after each: 5|0|0, 5|2|0, 5|2|2, 5|4|2, 5|4|4; a tie goes to the rank
  // with fewer running sequences, then to the lower rank (s0, s2 and s4).
  EXPECT_EQ(ranks, (std::vector<int32_t>{0, 1, 2, 1, 2, 1}));
  ExpectPoolsHoldOnlyTheirSequences(s, {"long", "s0", "s1", "s2", "s3", "s4"});
  // Each pool is its rank's range of the host pool's block ids: rank r's are [16 r, 16 r + 16).
  for (const char* id : {"long", "s0", "s1", "s2", "s3", "s4"}) {
    const Sequence* q = s.Find(id);
    EXPECT_EQ(s.pool(q->dp_rank).first_id(), 16 * q->dp_rank);
    for (int32_t b : q->blocks) EXPECT_TRUE(b >= 16 * q->dp_rank && b < 16 * q->dp_rank + 16) << id << " " << b;
  }
  // The first block each rank hands out is the first of its range.
  EXPECT_EQ(s.Find("s0")->blocks[0], 16);
  EXPECT_EQ(s.Find("s1")->blocks[0], 32);
  s.Remove("s0");
  ExpectPoolsHoldOnlyTheirSequences(s, {"long", "s1", "s2", "s3", "s4"});
  EXPECT_EQ(s.pool(1).num_in_use(), 4);
}

TEST(SchedulerDataParallelTest, APrefixIsSharedOnlyWithinItsRanksPool) {
  Scheduler s(Options(2), /*num_blocks=*/16);
  s.Add(Seq("a", 13));  // 3 full blocks, published once computed
  Step(s);
  EXPECT_EQ(s.Find("a")->dp_rank, 0);
  s.Remove("a");  // its blocks stay cached in rank 0's pool
  // Rank 0 holds the prefix: b goes there (0 + 4 - 3 blocks against 0 + 4) and shares it.
  s.Add(Seq("b", 14));
  Step(s);
  const Sequence* b = s.Find("b");
  EXPECT_EQ(b->dp_rank, 0);
  EXPECT_EQ(b->metrics.cached_prompt_tokens, 12);
  // With b's 4 blocks in use there, c (the same prefix) is cheaper on rank 1 (4 against
  // 4 + 4 - 3), where nothing is cached: it computes the whole prompt.
  s.Add(Seq("c", 14));
  Step(s);
  const Sequence* c = s.Find("c");
  EXPECT_EQ(c->dp_rank, 1);
  EXPECT_EQ(c->metrics.cached_prompt_tokens, 0);
  EXPECT_EQ(s.pool(1).stats().hit_blocks, 0);
  EXPECT_EQ(s.pool(0).stats().hit_blocks, 3);
}

TEST(SchedulerDataParallelTest, ASequenceShortOfBlocksPreemptsOnlyItsOwnRanks) {
  Scheduler s(Options(2), /*num_blocks=*/4);
  s.Add(Seq("a", 6, 1));    // rank 0
  s.Add(Seq("b", 6, 100));  // rank 1
  s.Add(Seq("c", 6, 200));  // rank 0 (2 + 2 blocks each way, one running each: the lower rank)
  EXPECT_EQ(Step(s), 0);  // the prompts, 2 blocks each: rank 0 full
  EXPECT_EQ(s.Find("c")->dp_rank, 0);
  EXPECT_EQ(Step(s), 0);  // positions 6
  EXPECT_EQ(Step(s), 0);  // positions 7
  // Position 8 needs a third block: a takes c's (the newest of rank 0), b one of rank 1's.
  // (c, back in the queue, finds no room on either rank.)
  EXPECT_EQ(Step(s), 1);
  EXPECT_EQ(s.Find("c")->state, SequenceState::kWaiting);
  EXPECT_TRUE(s.Find("c")->blocks.empty());
  EXPECT_EQ(s.Find("b")->state, SequenceState::kRunning);
  EXPECT_EQ(s.Find("a")->blocks.size(), 3u);
  EXPECT_EQ(s.Find("b")->blocks.size(), 3u);
  ExpectPoolsHoldOnlyTheirSequences(s, {"a", "b", "c"});
  // c waits until a pool has room; a ends, and c comes back on rank 0, recomputed.
  s.Remove("a");
  Step(s);
  EXPECT_EQ(s.Find("c")->state, SequenceState::kRunning);
  EXPECT_EQ(s.Find("c")->dp_rank, 0);
  ExpectPoolsHoldOnlyTheirSequences(s, {"b", "c"});
}

TEST(SchedulerDataParallelTest, APreemptionNeverTakesAnotherRanksSequence) {
  Scheduler s(Options(2), /*num_blocks=*/3);
  s.Add(Seq("a", 4, 1));    // rank 0
  s.Add(Seq("b", 4, 100));  // rank 1
  s.Add(Seq("c", 4, 200));  // rank 0
  s.Add(Seq("d", 2, 300));  // rank 1 (3 blocks against 2)
  EXPECT_EQ(Step(s), 0);
  EXPECT_EQ(s.Find("d")->dp_rank, 1);
  // Position 4 takes the last block of each pool (a, b); c finds none on rank 0, and the
  // newest sequence, d, is rank 1's: c gives its own blocks up, d keeps running.
  EXPECT_EQ(Step(s), 1);
  EXPECT_EQ(s.Find("c")->state, SequenceState::kWaiting);
  EXPECT_EQ(s.Find("d")->state, SequenceState::kRunning);
  ExpectPoolsHoldOnlyTheirSequences(s, {"a", "b", "c", "d"});
}

TEST(SchedulerDataParallelTest, ASequenceNoPoolCanHoldIsRejected) {
  Scheduler s(Options(2), /*num_blocks=*/2);
  s.Add(Seq("small", 3));
  s.Add(Seq("huge", 20));  // 5 blocks: more than any rank's pool
  StepPlan plan = s.Schedule();
  ASSERT_EQ(plan.rejected.size(), 1u);
  EXPECT_EQ(plan.rejected[0]->id, "huge");
  EXPECT_EQ(s.pool(0).num_in_use() + s.pool(1).num_in_use(), 1);
}

}  // namespace
}  // namespace tandem
