// The scheduler's prefix cache over a layout with per-sequence streams (DeepSeek-V4's
// rings and states): a prompt's prefill is cut where its state snapshot is due, the
// snapshot is asked for after that step, and a later prompt sharing the prefix takes the
// cached blocks only as far as a snapshot reaches, restoring from it. Blocks of 4 tokens
// keep the positions readable.
#include "engine/runtime/scheduler.h"

#include <memory>
#include <numeric>

#include "gtest/gtest.h"
#include "tests/unit/engine/runtime/scheduler_test_support.h"

namespace tandem {
namespace {

using testing::Seq;

constexpr int32_t kBlock = 4;

SchedulerOptions StateOptions(int32_t snapshots) {
  return {.block_size = kBlock, .max_batch_tokens = 100, .max_running = 4, .enable_prefix_cache = true,
          .layout_fingerprint = 42, .num_state_slots = 8, .num_prefix_states = snapshots};
}

// One step: the chunks planned (start, length) by id.
std::vector<std::pair<int32_t, int32_t>> Step(Scheduler& s) {
  StepPlan plan = s.Schedule();
  std::vector<std::pair<int32_t, int32_t>> out;
  for (const ScheduledChunk& c : plan.chunks) out.push_back({c.start, c.num_tokens});
  s.OnStepComputed(plan);
  return out;
}

// A 10-token prompt prefilled to its end (its snapshot at 8 taken), then removed.
void PrefillAndRemove(Scheduler& s, const std::string& id, int first = 1) {
  s.Add(Seq(id, 10, first));
  Step(s);
  Step(s);
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u) << id;
  s.Remove(id);
}

TEST(SchedulerStateSnapshotTest, PrefillIsCutWhereTheSnapshotIsDueAndAHitRestoresIt) {
  Scheduler s(StateOptions(2), /*num_blocks=*/32);
  s.Add(Seq("a", 10));
  // Its last full block ends at 8: the chunk stops there and the state is snapshotted.
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 8}}));
  const Sequence* a = s.Find("a");
  std::vector<StateCopy> copies = s.TakeStateSnapshots();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, a->state_slot);
  EXPECT_GE(copies[0].to, 8);  // past the running slots
  EXPECT_TRUE(s.prefix_states().Contains(a->block_hashes[1]));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{8, 2}}));
  EXPECT_TRUE(s.TakeStateSnapshots().empty());
  s.Remove("a");

  // The same 10 tokens and 3 more: blocks 0 and 1 are cached and the snapshot ends there.
  s.Add(Seq("b", 13));
  StepPlan plan = s.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  Sequence* b = plan.chunks[0].seq;
  EXPECT_EQ(plan.chunks[0].start, 8);
  EXPECT_EQ(plan.chunks[0].num_tokens, 4);  // cut at 12, its own last full block
  EXPECT_EQ(b->restore_state_from, copies[0].to);
  EXPECT_EQ(b->metrics.cached_prompt_tokens, 8);
  b->restore_state_from = -1;  // (the engine copies it in and unpins)
  s.prefix_states().Unpin(copies[0].to);
  s.OnStepComputed(plan);
  ASSERT_EQ(s.TakeStateSnapshots().size(), 1u);
  EXPECT_EQ(s.prefix_states().num_held(), 2);
}

TEST(SchedulerStateSnapshotTest, APromptFillingItsBlocksIsSnapshottedOneBlockEarlierToo) {
  Scheduler s(StateOptions(4), 32);
  s.Add(Seq("a", 8));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 4}}));
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{4, 4}}));
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
  s.Remove("a");
  // Resubmitted, its last token must be computed: the hit is the first block.
  s.Add(Seq("again", 8));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{4, 4}}));
  EXPECT_TRUE(s.TakeStateSnapshots().empty());  // both held already
}

TEST(SchedulerStateSnapshotTest, ASharedPrefixGetsItsSnapshotFromTheSecondPromptThatSharesIt) {
  Scheduler s(StateOptions(4), 32);
  // An 8-token "system prompt" (two blocks), then 6 tokens of each request's own.
  auto prompt = [](const std::string& id, int32_t own) {
    std::unique_ptr<Sequence> q = Seq(id, 14);
    for (int i = 8; i < 14; ++i) q->tokens[i] = own + i;
    return q;
  };
  s.Add(prompt("a", 100));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 12}}));  // its own last full block
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
  Step(s);
  s.Remove("a");
  // b shares a's first two blocks, which no snapshot ends: it computes them, and is cut
  // where they end so that its state there is kept.
  s.Add(prompt("b", 200));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 8}}));
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{8, 4}}));
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
  Step(s);
  s.Remove("b");
  // c takes the shared blocks and b's snapshot.
  s.Add(prompt("c", 300));
  StepPlan plan = s.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 8);
  EXPECT_EQ(plan.chunks[0].seq->metrics.cached_prompt_tokens, 8);
  EXPECT_GE(plan.chunks[0].seq->restore_state_from, 0);
}

TEST(SchedulerStateSnapshotTest, ADecodingSequenceKeepsOneSnapshotWhereItsTokensFillABlock) {
  Scheduler s(StateOptions(4), 32);
  s.Add(Seq("a", 6));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 4}}));  // its last full block
  ASSERT_EQ(s.TakeStateSnapshots().size(), 1u);
  Step(s);  // [4, 6): the prompt done
  Sequence* a = s.Find("a");
  uint64_t first = 0;
  // One token at a time: positions 6, 7 fill block 1 (snapshot), 8..11 fill block 2 (the
  // next, replacing it).
  for (int32_t t = 0; t < 6; ++t) {
    a->tokens.push_back(500 + t);
    s.OnTokenAppended(*a);
    Step(s);
    const std::vector<StateCopy> c = s.TakeStateSnapshots();
    const bool fills = a->num_computed % kBlock == 0;
    EXPECT_EQ(c.size(), fills ? 1u : 0u) << "computed " << a->num_computed;
    if (a->num_computed == 8) first = a->block_hashes[1];
  }
  ASSERT_EQ(a->num_computed, 12);
  EXPECT_FALSE(s.prefix_states().Contains(first));
  EXPECT_TRUE(s.prefix_states().Contains(a->block_hashes[2]));
  EXPECT_EQ(s.prefix_states().num_held(), 2);  // the prompt's, and the last decode one
}

TEST(SchedulerStateSnapshotTest, NoDecodeSnapshotsWhenTheyAreOff) {
  SchedulerOptions o = StateOptions(4);
  o.decode_state_snapshots = false;
  Scheduler s(o, 32);
  s.Add(Seq("a", 6));
  Step(s);
  Step(s);
  s.TakeStateSnapshots();
  Sequence* a = s.Find("a");
  for (int32_t t = 0; t < 6; ++t) {
    a->tokens.push_back(500 + t);
    s.OnTokenAppended(*a);
    Step(s);
    EXPECT_TRUE(s.TakeStateSnapshots().empty());
  }
}

TEST(SchedulerStateSnapshotTest, CachedBlocksWithoutASnapshotAreNotUsed) {
  Scheduler s(StateOptions(1), 32);
  PrefillAndRemove(s, "a");
  PrefillAndRemove(s, "other", /*first=*/100);  // its snapshot takes the only slot
  EXPECT_EQ(s.prefix_states().evictions(), 1);
  s.Add(Seq("a2", 10));  // a's blocks are cached, its snapshot is gone: computed from 0
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 8}}));
  EXPECT_EQ(s.TakeStateSnapshots().size(), 1u);
}

TEST(SchedulerStateSnapshotTest, ARemovedSequenceGivesBackItsPinnedSnapshot) {
  Scheduler s(StateOptions(1), 32);
  PrefillAndRemove(s, "a");
  s.Add(Seq("b", 10));
  StepPlan plan = s.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  const int32_t pinned = plan.chunks[0].seq->restore_state_from;
  ASSERT_GE(pinned, 0);
  EXPECT_EQ(s.prefix_states().Put(999), -1);  // pinned until the copy
  s.Remove("b");                              // cancelled before its step ran
  EXPECT_EQ(s.prefix_states().Put(999), pinned);
}

TEST(SchedulerStateSnapshotTest, WithoutSnapshotSlotsNothingIsCutSharedOrPublished) {
  Scheduler s(StateOptions(0), 32);
  EXPECT_FALSE(s.prefix_cache_usable());
  s.Add(Seq("a", 10));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 10}}));
  EXPECT_TRUE(s.TakeStateSnapshots().empty());
  EXPECT_EQ(s.blocks().num_cached(), 0);
  s.Remove("a");
  s.Add(Seq("b", 10));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 10}}));
}

TEST(SchedulerStateSnapshotTest, ALayoutWithoutStatesSharesBlocksAsBefore) {
  SchedulerOptions o = StateOptions(0);
  o.num_state_slots = 0;
  Scheduler s(o, 32);
  s.Add(Seq("a", 10));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{0, 10}}));
  s.Remove("a");
  s.Add(Seq("b", 10));
  EXPECT_EQ(Step(s), (std::vector<std::pair<int32_t, int32_t>>{{8, 2}}));
}

}  // namespace
}  // namespace tandem
