// Checks for broken invariants. A failed check is a bug, never an input error: it
// prints where and why, then aborts. Input errors are absl::Status values instead.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace tandem::internal {

// Collects the streamed message of a failed check and aborts when destroyed.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Makes `CHECK(x) << ...` an expression of type void in both branches.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem::internal

#define TANDEM_CHECK(condition)                \
  (condition) ? (void)0                        \
              : ::tandem::internal::Voidify() & \
                    ::tandem::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define TANDEM_CHECK_EQ(a, b) TANDEM_CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define TANDEM_CHECK_LT(a, b) TANDEM_CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define TANDEM_CHECK_LE(a, b) TANDEM_CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "
#define TANDEM_CHECK_GE(a, b) TANDEM_CHECK((a) >= (b)) << "(" << (a) << " vs " << (b) << ") "
