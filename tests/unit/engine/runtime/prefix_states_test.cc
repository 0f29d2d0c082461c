// PrefixStates: the snapshot slots of per-sequence KV streams, least recently used first
// out, pinned while a restore waits for its copy.
#include "engine/runtime/prefix_states.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(PrefixStatesTest, PutGivesSlotsInItsRangeOncePerHash) {
  PrefixStates p(/*first_slot=*/10, /*num_slots=*/2);
  EXPECT_EQ(p.size(), 2);
  const int32_t a = p.Put(111);
  const int32_t b = p.Put(222);
  EXPECT_TRUE((a == 10 && b == 11) || (a == 11 && b == 10)) << a << " " << b;
  EXPECT_EQ(p.Put(111), -1);  // already held: nothing to write
  EXPECT_TRUE(p.Contains(111));
  EXPECT_TRUE(p.Contains(222));
  EXPECT_FALSE(p.Contains(333));
  EXPECT_EQ(p.num_held(), 2);
  EXPECT_EQ(p.evictions(), 0);
}

TEST(PrefixStatesTest, TheLeastRecentlyUsedIsForgottenFirst) {
  PrefixStates p(0, 2);
  const int32_t a = p.Put(1);
  p.Put(2);
  // Using 1 makes 2 the oldest.
  EXPECT_EQ(p.Acquire(1), a);
  p.Unpin(a);
  const int32_t c = p.Put(3);
  EXPECT_NE(c, a);
  EXPECT_TRUE(p.Contains(1));
  EXPECT_FALSE(p.Contains(2));
  EXPECT_TRUE(p.Contains(3));
  EXPECT_EQ(p.evictions(), 1);
  EXPECT_EQ(p.Acquire(2), -1);
}

TEST(PrefixStatesTest, APinnedSnapshotIsNeverOverwritten) {
  PrefixStates p(5, 1);
  const int32_t a = p.Put(7);
  ASSERT_EQ(a, 5);
  ASSERT_EQ(p.Acquire(7), 5);
  EXPECT_EQ(p.Put(8), -1);  // the only slot waits to be read
  EXPECT_TRUE(p.Contains(7));
  p.Unpin(5);
  EXPECT_EQ(p.Put(8), 5);
  EXPECT_FALSE(p.Contains(7));
}

TEST(PrefixStatesTest, AForgottenSnapshotsSlotIsReusedFirst) {
  PrefixStates p(0, 3);
  const int32_t a = p.Put(1);
  p.Put(2);
  p.Forget(1);
  EXPECT_FALSE(p.Contains(1));
  EXPECT_EQ(p.num_held(), 1);
  EXPECT_EQ(p.Put(3), a);  // before the empty third slot: it is at the front now
  EXPECT_EQ(p.evictions(), 0);
  ASSERT_EQ(p.Acquire(2), 1);
  p.Forget(2);  // pinned: kept
  EXPECT_TRUE(p.Contains(2));
  p.Forget(99);  // unknown: nothing
}

TEST(PrefixStatesTest, NoSlotsHoldNothing) {
  PrefixStates p(3, 0);
  EXPECT_EQ(p.Put(1), -1);
  EXPECT_FALSE(p.Contains(1));
  EXPECT_EQ(p.Acquire(1), -1);
}

TEST(PrefixStatesDeathTest, UnpinningWhatIsNotPinnedAborts) {
  PrefixStates p(0, 1);
  p.Put(1);
  EXPECT_DEATH(p.Unpin(0), "not pinned");
  EXPECT_DEATH(p.Unpin(4), "snapshot slot 4");
}

}  // namespace
}  // namespace tandem
