#include "services/common/shutdown_signal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

namespace tandem::service {
namespace {

using std::chrono::milliseconds;

class ShutdownSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallShutdownSignalHandling();
    ResetShutdownForTesting();
  }
};

TEST_F(ShutdownSignalTest, WaitsUntilRequested) {
  EXPECT_FALSE(ShutdownRequested());
  EXPECT_FALSE(WaitForShutdownSignalFor(milliseconds(20)).has_value());
  std::thread requester([] {
    std::this_thread::sleep_for(milliseconds(20));
    RequestShutdown();
  });
  EXPECT_EQ(WaitForShutdownSignal(), 0);
  requester.join();
  EXPECT_TRUE(ShutdownRequested());
  EXPECT_EQ(WaitForShutdownSignalFor(milliseconds(0)), 0);  // stays requested
}

TEST_F(ShutdownSignalTest, SigtermAndSigintRequestShutdown) {
  // Blocked in this thread and in threads it starts: the watcher receives them.
  sigset_t mask;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &mask), 0);
  EXPECT_TRUE(sigismember(&mask, SIGTERM));
  EXPECT_TRUE(sigismember(&mask, SIGINT));

  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ(WaitForShutdownSignalFor(milliseconds(5000)), SIGTERM);
  ResetShutdownForTesting();
  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  EXPECT_EQ(WaitForShutdownSignalFor(milliseconds(5000)), SIGINT);
}

TEST_F(ShutdownSignalTest, SecondSignalExitsAtOnce) {
  // A forked child would lack the watcher thread: re-execute the test binary instead.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        kill(getpid(), SIGTERM);
        WaitForShutdownSignal();
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::exit(0);
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "second signal");
}

}  // namespace
}  // namespace tandem::service
