// The shared-memory collectives on 2 ranks (forked processes) against a memcpy of the same
// bytes in the same run: AllReduceSum of N bytes of floats, AllToAll with N bytes to the
// other rank (and N to itself), and Barrier latency. Each figure is the median over
// repetitions of the time per operation on rank 0; `*_over_memcpy` is memcpy's time over
// the operation's (1.0: as fast as one copy of the payload). Prints JSON (bench/README.md);
// not a test: absolute timings on shared machines are noisy.
//
//   collectives_bench [--json PATH] [--slot-bytes N]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/parallel/rank_processes.h"
#include "engine/parallel/shm_collectives.h"
#include "nlohmann/json.hpp"

namespace tandem::parallel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSizes[] = {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};

int RepsFor(size_t bytes) { return bytes <= (size_t{64} << 10) ? 2000 : bytes <= (size_t{1} << 20) ? 200 : 20; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `op`, the median of 5 batches of `reps` calls.
template <typename Op>
double SecondsPerCall(int reps, Op&& op) {
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < reps; ++i) op();
    batches.push_back(std::chrono::duration<double>(Clock::now() - start).count() / reps);
  }
  return Median(batches);
}

double MemcpySeconds(size_t bytes) {
  std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes);
  return SecondsPerCall(RepsFor(bytes), [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
}

// Runs on each rank; rank 0 fills `out`, which it writes to `path` (the parent cannot
// see a child's memory).
int RunRank(int rank, size_t slot_bytes, const std::string& path) {
  ShmGroupOptions o;
  o.name = absl::StrCat("bench-", ::getppid());
  o.world_size = 2;
  o.rank = rank;
  o.slot_bytes = slot_bytes;
  absl::StatusOr<std::unique_ptr<ShmCollectives>> group = ShmCollectives::Open(o);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
    return 1;
  }
  ShmCollectives& g = **group;
  bool ok = true;
  const auto check = [&ok](const absl::Status& s) {
    if (!s.ok() && ok) std::fprintf(stderr, "%s\n", s.ToString().c_str());
    ok = ok && s.ok();
  };
  nlohmann::json rows = nlohmann::json::array();
  for (size_t bytes : kSizes) {
    std::vector<float> data(bytes / sizeof(float), 0.0f);  // stays 0: no overflow over reps
    std::vector<std::byte> block(bytes, std::byte{7});
    std::vector<std::byte> recv(2 * bytes);
    std::vector<size_t> sizes(2);
    const std::vector<std::span<const std::byte>> send = {block, block};
    const int reps = RepsFor(bytes);
    check(g.Barrier());
    const double reduce = SecondsPerCall(reps, [&] { check(g.AllReduceSum(data)); });
    check(g.Barrier());
    const double exchange = SecondsPerCall(reps, [&] { check(g.AllToAll(send, recv, sizes)); });
    const double copy = rank == 0 ? MemcpySeconds(bytes) : 0.0;
    check(g.Barrier());
    rows.push_back({{"bytes", bytes},
                    {"memcpy_us", copy * 1e6},
                    {"allreduce_us", reduce * 1e6},
                    {"allreduce_over_memcpy", copy / reduce},
                    {"alltoall_us", exchange * 1e6},
                    {"alltoall_over_memcpy", copy / exchange}});
  }
  check(g.Barrier());
  const double barrier = SecondsPerCall(20000, [&] { check(g.Barrier()); });
  if (!ok) return 1;
  if (rank != 0) return 0;
  const nlohmann::json out = {
      {"benchmark", "collectives_bench"},
      {"backend", "shm"},
      {"ranks", 2},
      {"cpus", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
      {"slot_bytes", slot_bytes},
      {"reference", "memcpy of the same bytes, one thread, measured by rank 0 in the same run"},
      {"barrier_us", barrier * 1e6},
      {"sizes", rows}};
  std::ofstream(path) << out.dump(2) << "\n";
  return 0;
}

int Main(int argc, char** argv) {
  std::string json_path;
  size_t slot_bytes = size_t{1} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--slot-bytes" && i + 1 < argc && absl::SimpleAtoi(argv[++i], &slot_bytes)) {
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--slot-bytes N]\n", argv[0]);
      return 2;
    }
  }
  char tmp[] = "/tmp/collectives-bench-XXXXXX";
  const int fd = ::mkstemp(tmp);
  if (fd < 0) return 1;
  ::close(fd);
  absl::StatusOr<std::vector<RankExit>> exits =
      RunRanks(2, [&](int rank) { return RunRank(rank, slot_bytes, tmp); });
  bool ok = exits.ok();
  for (const RankExit& e : exits.ok() ? *exits : std::vector<RankExit>{}) {
    if (!e.ok()) std::fprintf(stderr, "%s\n", e.ToString().c_str());
    ok = ok && e.ok();
  }
  std::ifstream in(tmp);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(tmp);
  if (!ok) return 1;
  std::fputs(text.c_str(), stdout);
  if (!json_path.empty()) std::ofstream(json_path) << text;
  return 0;
}

}  // namespace
}  // namespace tandem::parallel

int main(int argc, char** argv) { return tandem::parallel::Main(argc, argv); }
