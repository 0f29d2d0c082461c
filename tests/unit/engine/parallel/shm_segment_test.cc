// Named segments (create, open, replace, unlink only one's own) and the liveness of
// processes: a zombie or a reused pid is not the process the group recorded.
#include "engine/parallel/shm_segment.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "tests/unit/engine/parallel/group_test_util.h"

namespace tandem::parallel {
namespace {

using testing::LeftoverSegments;
using testing::UniqueName;

TEST(SharedSegmentTest, CreateOpenAndUnlink) {
  const SegmentName name{UniqueName("seg"), ""};
  absl::StatusOr<std::unique_ptr<SharedSegment>> created = SharedSegment::Create(name, 8192);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)->size(), 8192u);
  EXPECT_EQ((*created)->path(), SegmentPath(name));
  std::memcpy((*created)->data() + 100, "tandem", 6);

  absl::StatusOr<std::unique_ptr<SharedSegment>> opened = SharedSegment::Open(name);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->size(), 8192u);
  EXPECT_EQ(std::memcmp((*opened)->data() + 100, "tandem", 6), 0);
  EXPECT_TRUE((*opened)->NameRefersHere());

  (*created)->UnlinkIfOurs();
  EXPECT_FALSE((*opened)->NameRefersHere());
  EXPECT_TRUE(absl::IsNotFound(SharedSegment::Open(name).status()));
  // The mappings outlive the name.
  EXPECT_EQ(std::memcmp((*opened)->data() + 100, "tandem", 6), 0);
  EXPECT_TRUE(LeftoverSegments().empty());
}

TEST(SharedSegmentTest, CreateReplacesALeftoverAndTheOldOwnerDoesNotUnlinkTheNewOne) {
  const SegmentName name{UniqueName("seg"), ""};
  absl::StatusOr<std::unique_ptr<SharedSegment>> old_one = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(old_one.ok()) << old_one.status();
  absl::StatusOr<std::unique_ptr<SharedSegment>> new_one = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(new_one.ok()) << new_one.status();
  EXPECT_FALSE((*old_one)->NameRefersHere());
  EXPECT_TRUE((*new_one)->NameRefersHere());
  (*old_one)->UnlinkIfOurs();
  EXPECT_TRUE((*new_one)->NameRefersHere());
  (*new_one)->UnlinkIfOurs();
  EXPECT_TRUE(LeftoverSegments().empty());
}

TEST(SharedSegmentTest, NamesAreChecked) {
  EXPECT_TRUE(ValidateSegmentName({"replica-7_a.b", ""}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSegmentName({"", ""})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSegmentName({"a/b", ""})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSegmentName({std::string(201, 'a'), ""})));
  EXPECT_TRUE(absl::IsInvalidArgument(SharedSegment::Create({"a b", ""}, 4096).status()));
}

TEST(ProcessAliveTest, SelfIsAliveAndAZombieOrAReusedPidIsNot) {
  const ProcessIdentity self = SelfIdentity();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_time, 0u);
  EXPECT_TRUE(ProcessAlive(self));
  // The same pid with another start time: a process that reused a dead one's pid.
  EXPECT_FALSE(ProcessAlive({self.pid, self.start_time + 1}));

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::_exit(0);
  }
  const ProcessIdentity id = IdentityOf(child);
  EXPECT_TRUE(ProcessAlive(id));
  // Exited, not reaped: kill(pid, 0) still succeeds, the group must not call it alive.
  for (int i = 0; i < 2000 && ProcessAlive(id); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(ProcessAlive(id));
  EXPECT_EQ(::kill(child, 0), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(ProcessAlive(id));
}

}  // namespace
}  // namespace tandem::parallel
