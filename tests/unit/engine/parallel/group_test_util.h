// Helpers of the shared-memory collectives' tests: groups of forked ranks, inputs whose
// sums depend on the order of addition, and the check that no segment is left behind.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/parallel/rank_processes.h"
#include "engine/parallel/shm_collectives.h"
#include "gtest/gtest.h"

namespace tandem::parallel::testing {

// Inside a rank: prints the failed condition and makes the rank exit with 1.
#define RANK_EXPECT(rank, cond, ...)                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "rank %d: %s:%d: expected %s %s\n", (rank), __FILE__,    \
                   __LINE__, #cond, ::absl::StrCat("", ##__VA_ARGS__).c_str());     \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

// Every segment a test creates starts with this, so that concurrent runs (other build
// trees on the machine) never meet.
inline std::string TestPrefix() { return absl::StrCat("test-", ::getpid(), "-"); }

inline std::string UniqueName(const std::string& what) {
  static int counter = 0;
  return absl::StrCat(TestPrefix(), what, "-", counter++);
}

// The names under /dev/shm of this test process's segments ("tandem-test-<pid>-...").
inline std::vector<std::string> LeftoverSegments() {
  std::vector<std::string> found;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return found;
  const std::string prefix = absl::StrCat("tandem-", TestPrefix());
  while (const dirent* e = ::readdir(dir)) {
    if (absl::StartsWith(e->d_name, prefix)) found.push_back(e->d_name);
  }
  ::closedir(dir);
  return found;
}

inline ShmGroupOptions TestOptions(const std::string& name, int world, int rank) {
  ShmGroupOptions o;
  o.name = name;
  o.world_size = world;
  o.rank = rank;
  o.slot_bytes = 4096;  // small, so that modest messages go in several chunks
  o.timeout = absl::Seconds(10);
  return o;
}

// Runs body(group) on every rank of a fresh group of `world` ranks (options from
// TestOptions, then `adjust`); returns the ranks' exits. A rank whose Open fails exits 2.
inline std::vector<RankExit> RunGroup(
    int world, const std::string& name, const std::function<int(ShmCollectives&)>& body,
    const std::function<void(ShmGroupOptions&)>& adjust = nullptr) {
  absl::StatusOr<std::vector<RankExit>> exits = RunRanks(
      world,
      [&](int rank) {
        ShmGroupOptions o = TestOptions(name, world, rank);
        if (adjust) adjust(o);
        absl::StatusOr<std::unique_ptr<ShmCollectives>> group = ShmCollectives::Open(o);
        if (!group.ok()) {
          std::fprintf(stderr, "rank %d: Open: %s\n", rank, group.status().ToString().c_str());
          return 2;
        }
        return body(**group);
      },
      absl::Seconds(60));
  if (!exits.ok()) {
    ADD_FAILURE() << exits.status();
    return {};
  }
  return *exits;
}

inline void ExpectAllOk(const std::vector<RankExit>& exits) {
  EXPECT_FALSE(exits.empty());
  for (const RankExit& e : exits) EXPECT_TRUE(e.ok()) << e.ToString();
}

// Values of very different magnitudes and both signs: their float sum depends on the
// order of the additions (from three ranks up: a + b is b + a), so a reduction that does
// not add in rank order is caught. Every 61st element is -0.0f on every rank, whose sum
// is -0.0f: a reduction that starts from 0.0f (giving +0.0f) is caught too.
inline float Input(int rank, size_t i, uint64_t salt = 0) {
  if (i % 61 == 5) return -0.0f;
  uint64_t h = (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL) ^
               (salt * 0x94D049BB133111EBULL);
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ULL;
  h ^= h >> 32;
  const float mantissa = 1.0f + static_cast<float>(h & 0xffff) / 65536.0f;
  const int exponent = static_cast<int>((h >> 16) % 48) - 24;
  return ((h >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}

// ((x_0 + x_1) + x_2) + ...: what AllReduceSum must return, bit for bit.
inline std::vector<float> RankOrderSum(int world, size_t n, uint64_t salt = 0) {
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) {
    float acc = Input(0, i, salt);
    for (int r = 1; r < world; ++r) acc += Input(r, i, salt);
    sum[i] = acc;
  }
  return sum;
}

inline std::byte Pattern(int a, int b, size_t i) {
  return static_cast<std::byte>((a * 131 + b * 29 + i * 7 + (i >> 8) * 13 + 3) & 0xff);
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tandem::parallel::testing
