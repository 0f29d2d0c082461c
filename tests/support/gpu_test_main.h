// The exit status of a GPU test binary (tests labelled gpu, cmake/TandemComponent.cmake):
// gtest's, except that a run in which no test passed and some skipped (no usable GPU) exits
// with kAllSkippedExitCode, which ctest reads as "skipped" (SKIP_RETURN_CODE) and the
// device scripts as a failure (the GPU they run on must be usable). A failed test exits 1
// whatever else skipped, so a skip never hides a failure.
#pragma once

#include "gtest/gtest.h"

namespace tandem::testing {

inline constexpr int kAllSkippedExitCode = 77;

// RUN_ALL_TESTS() with the status above; after InitGoogleTest.
inline int RunGpuTests() {
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (u.successful_test_count() == 0 && u.skipped_test_count() > 0) return kAllSkippedExitCode;
  return 0;
}

}  // namespace tandem::testing
