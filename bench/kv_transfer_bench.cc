// KV transfer bandwidth between two processes through the UCX transfer engine
// (services/common/transfer), the figure bench/kv_transfer_bench.sh compares with
// ucx_perftest's ucp_put_bw in the same run.
//
//   kv_transfer_bench [--sizes 1,4,16,64] [--iterations N] [--piece BYTES] [--register]
//                     [--ucx NAME=VALUE]... [--no-tune-tcp] [--no-direct] [--depth N]
//                     [--idle-spin-us N] [--label NAME] [--json FILE]
//
// The process forks before anything starts a thread: the child is the receiver (a decode
// replica: allocates, or with --register registers, a destination buffer and publishes
// its descriptor through a pipe), the parent the sender (a prefill replica). For each
// size (MiB), batches of that many bytes in three ways:
//   kv_blocks     puts of --piece bytes (default 147,456 = 64 tokens x 576 fp32 values,
//                 one block of one layer) from a contiguous source to destination block
//                 slots in shuffled order, as a decode block table hands them out (so the
//                 batch cannot merge them into larger puts); one batch at a time, timed
//                 from Flush to done (remotely complete)
//   single_put    one put of the whole size, one batch at a time
//   kv_pipelined  kv_blocks batches streamed with up to --depth (4) in flight, as prefill
//                 streams layers (and ucx_perftest streams puts); time per batch = round
//                 time / batches, over 3 rounds
// Bandwidth = bytes / time per batch, in GB/s (1e9 bytes/s); best and median over the
// iterations (rounds), after warm-up. The receiver checks an XXH3 checksum of what arrived
// after each shape. Transports come from the UCX environment (UCX_TLS, UCX_NET_DEVICES),
// as for ucx_perftest; UCX logs go to stderr (stdout carries the JSON).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/common/transfer/checksum.h"
#include "services/common/transfer/ucx_transfer_engine.h"

namespace tandem::transfer {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct Flags {
  std::vector<size_t> sizes_mib = {1, 4, 16, 64};
  int iterations = 0;  // 0: by size (more for small sizes)
  size_t piece = 64 * 576 * 4;
  bool register_memory = false;
  std::string label;
  std::string json_path;
  int64_t idle_spin_us = -1;  // -1: the engine's default
  std::vector<std::pair<std::string, std::string>> ucx_config;  // --ucx NAME=VALUE
  bool tune_tcp = true;
  bool direct_shared_memory = true;
  int depth = 4;  // batches in flight in kv_pipelined
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "kv_transfer_bench: %s\nusage: kv_transfer_bench [--sizes 1,4,16,64] "
               "[--iterations N] [--piece BYTES] [--register] [--ucx NAME=VALUE]... "
               "[--no-tune-tcp] [--no-direct] [--depth N] [--idle-spin-us N] [--label NAME] "
               "[--json FILE]\n",
               why);
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--sizes") {
      f.sizes_mib.clear();
      std::string list = value();
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        const long v = std::atol(list.substr(pos, comma - pos).c_str());
        if (v <= 0) Usage("sizes are positive MiB counts");
        f.sizes_mib.push_back(static_cast<size_t>(v));
        pos = comma + 1;
      }
    } else if (arg == "--iterations") {
      f.iterations = std::atoi(value().c_str());
    } else if (arg == "--piece") {
      f.piece = static_cast<size_t>(std::atol(value().c_str()));
      if (f.piece == 0) Usage("--piece must be positive");
    } else if (arg == "--register") {
      f.register_memory = true;
    } else if (arg == "--ucx") {
      const std::string kv = value();
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) Usage("--ucx takes NAME=VALUE (without the UCX_ prefix)");
      f.ucx_config.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (arg == "--depth") {
      f.depth = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--no-tune-tcp") {
      f.tune_tcp = false;
    } else if (arg == "--no-direct") {
      f.direct_shared_memory = false;
    } else if (arg == "--idle-spin-us") {
      f.idle_spin_us = std::atoll(value().c_str());
    } else if (arg == "--label") {
      f.label = value();
    } else if (arg == "--json") {
      f.json_path = value();
    } else {
      Usage(("unknown flag " + arg).c_str());
    }
  }
  return f;
}

// Line-oriented pipe I/O between the two processes.
bool WriteLine(int fd, const std::string& line) {
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

absl::StatusOr<std::unique_ptr<UcxTransferEngine>> NewEngine(const Flags& flags) {
  UcxTransferEngine::Options options;
  if (flags.idle_spin_us >= 0) options.idle_spin = absl::Microseconds(flags.idle_spin_us);
  options.ucx_config = flags.ucx_config;
  options.tune_tcp = flags.tune_tcp;
  options.direct_shared_memory = flags.direct_shared_memory;
  return UcxTransferEngine::Create(options);
}

bool ReadLine(int fd, std::string& line) {
  line.clear();
  char c;
  while (true) {
    const ssize_t n = read(fd, &c, 1);
    if (n <= 0) return false;
    if (c == '\n') return true;
    line.push_back(c);
  }
}

// The receiver: publishes its buffer, then answers "CLEAR" and "SUM <bytes>" until "QUIT".
int RunReceiver(const Flags& flags, size_t bytes, int in_fd, int out_fd) {
  auto engine = NewEngine(flags);
  if (!engine.ok()) {
    std::fprintf(stderr, "receiver: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> heap;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> region;
  if (flags.register_memory) {
    heap.assign(bytes, 0);
    region = (*engine)->RegisterMemory(heap.data(), heap.size());
  } else {
    region = (*engine)->AllocateMemory(bytes);
  }
  if (!region.ok()) {
    std::fprintf(stderr, "receiver: %s\n", region.status().ToString().c_str());
    return 1;
  }
  auto* data = static_cast<uint8_t*>((*region)->base());
  WriteLine(out_fd, absl::BytesToHexString((*region)->descriptor().Serialize()));
  std::string line;
  while (ReadLine(in_fd, line) && line != "QUIT") {
    if (line == "CLEAR") {
      std::memset(data, 0, bytes);
      WriteLine(out_fd, "OK");
    } else if (line.rfind("SUM ", 0) == 0) {
      const size_t n = std::min<size_t>(std::strtoull(line.c_str() + 4, nullptr, 10), bytes);
      WriteLine(out_fd, std::to_string(Checksum(data, n, 0)));
    }
  }
  engine->reset();  // stop progress (and so any write) before the region goes
  region->reset();
  return 0;
}

struct Series {
  std::string mode;
  size_t bytes = 0;
  size_t puts = 0;
  std::vector<double> seconds;
  bool verified = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One put: source bytes [src, src + length) to destination offset dst.
struct Piece {
  size_t src = 0;
  size_t dst = 0;
  size_t length = 0;
};

// `bytes` of source in pieces of `piece` bytes. Scattered: full pieces go to destination
// slots in a shuffled order (a decode block table after some churn: nothing to merge),
// the partial last piece to the end; otherwise in place.
std::vector<Piece> Layout(size_t bytes, size_t piece, bool scattered) {
  std::vector<Piece> pieces;
  for (size_t off = 0; off < bytes; off += piece) {
    pieces.push_back(Piece{off, off, std::min(piece, bytes - off)});
  }
  if (scattered) {
    const size_t full = bytes / piece;
    std::vector<size_t> slots(full);
    for (size_t i = 0; i < full; ++i) slots[i] = i;
    std::mt19937_64 rng(42);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (size_t i = 0; i < full; ++i) pieces[i].dst = slots[i] * piece;
  }
  return pieces;
}

absl::Status PutAll(TransferBatch& batch, const std::vector<uint8_t>& source,
                    const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) {
    absl::Status st = batch.Put(source.data() + p.src, p.length, p.dst);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// What the destination holds after the pieces landed, as XXH3.
uint64_t ExpectedChecksum(const std::vector<uint8_t>& source, const std::vector<Piece>& pieces,
                          size_t bytes) {
  std::vector<uint8_t> image(bytes);
  for (const Piece& p : pieces) std::memcpy(image.data() + p.dst, source.data() + p.src, p.length);
  return Checksum(image.data(), image.size(), 0);
}

// One batch at a time, each flushed and waited for: seconds per batch, after 2 warm-ups.
absl::Status TimeWaited(TransferEngine& engine, const RemoteMemoryDescriptor& dest,
                        const std::vector<uint8_t>& source, const std::vector<Piece>& pieces,
                        int iterations, std::vector<double>& seconds) {
  for (int it = -2; it < iterations; ++it) {
    auto batch = engine.NewBatch(dest);
    absl::Status st = PutAll(*batch, source, pieces);
    const absl::Time t0 = absl::Now();
    if (st.ok()) st = batch->Wait(absl::Seconds(120));
    if (!st.ok()) return st;
    if (it >= 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return absl::OkStatus();
}

// `iterations` batches back to back with up to `depth` in flight (how prefill streams
// layers, and how ucx_perftest streams puts), in 3 timed rounds after a warm-up round:
// per round, its time divided by `iterations`.
absl::Status TimePipelined(TransferEngine& engine, const RemoteMemoryDescriptor& dest,
                           const std::vector<uint8_t>& source, const std::vector<Piece>& pieces,
                           int iterations, int depth, std::vector<double>& seconds) {
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  absl::Status first_error;
  for (int round = -1; round < 3; ++round) {
    const absl::Time t0 = absl::Now();
    for (int it = 0; it < iterations; ++it) {
      auto batch = engine.NewBatch(dest);
      absl::Status st = PutAll(*batch, source, pieces);
      if (!st.ok()) return st;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return in_flight < depth; });
        ++in_flight;
      }
      batch->Flush(absl::Seconds(120), [&](absl::Status s) {
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
        if (!s.ok() && first_error.ok()) first_error = s;
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    if (!first_error.ok()) return first_error;
    if (round >= 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0) / iterations);
  }
  return absl::OkStatus();
}

int RunSender(const Flags& flags, size_t max_bytes, int in_fd, int out_fd) {
  std::string hex;
  if (!ReadLine(in_fd, hex)) {
    std::fprintf(stderr, "sender: the receiver did not start\n");
    return 1;
  }
  auto dest = RemoteMemoryDescriptor::Parse(absl::HexStringToBytes(hex));
  auto engine = NewEngine(flags);
  if (!dest.ok() || !engine.ok()) {
    std::fprintf(stderr, "sender: %s %s\n", dest.status().ToString().c_str(),
                 engine.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> source(max_bytes);
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  }

  std::vector<Series> all;
  std::string reply;
  for (size_t mib : flags.sizes_mib) {
    const size_t bytes = mib * kMiB;
    const int iterations = flags.iterations > 0
                               ? flags.iterations
                               : static_cast<int>(std::clamp<size_t>(256 / mib, 5, 50));
    for (const char* mode : {"kv_blocks", "single_put", "kv_pipelined"}) {
      Series s;
      s.mode = mode;
      s.bytes = bytes;
      const bool single = s.mode == "single_put";
      const std::vector<Piece> pieces = Layout(bytes, single ? bytes : flags.piece, !single);
      s.puts = pieces.size();
      WriteLine(out_fd, "CLEAR");
      ReadLine(in_fd, reply);
      absl::Status st = s.mode == "kv_pipelined"
                            ? TimePipelined(**engine, *dest, source, pieces, iterations,
                                            flags.depth, s.seconds)
                            : TimeWaited(**engine, *dest, source, pieces, iterations, s.seconds);
      if (!st.ok()) {
        std::fprintf(stderr, "sender: %s\n", st.ToString().c_str());
        return 1;
      }
      WriteLine(out_fd, "SUM " + std::to_string(bytes));
      ReadLine(in_fd, reply);
      s.verified = reply == std::to_string(ExpectedChecksum(source, pieces, bytes));
      if (!s.verified) std::fprintf(stderr, "sender: checksum mismatch at %zu MiB %s\n", mib, mode);
      all.push_back(std::move(s));
    }
  }
  WriteLine(out_fd, "QUIT");

  const char* tls = std::getenv("UCX_TLS");
  nlohmann::json out;
  out["benchmark"] = "kv_transfer";
  out["label"] = flags.label;
  out["ucx_tls"] = tls == nullptr ? "" : tls;
  out["destination"] = flags.register_memory ? "registered" : "allocated";
  out["peer_failure_detection"] = (*engine)->peer_failure_detection();
  out["piece_bytes"] = flags.piece;
  out["results"] = nlohmann::json::array();
  bool ok = true;
  for (const Series& s : all) {
    const double best = *std::min_element(s.seconds.begin(), s.seconds.end());
    const double median = Median(s.seconds);
    out["results"].push_back({{"size_bytes", s.bytes},
                              {"mode", s.mode},
                              {"puts", s.puts},
                              {"iterations", s.seconds.size()},
                              {"best_gbps", s.bytes / best / 1e9},
                              {"median_gbps", s.bytes / median / 1e9},
                              {"best_ms", best * 1e3},
                              {"median_ms", median * 1e3},
                              {"verified", s.verified}});
    ok &= s.verified;
  }
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!flags.json_path.empty()) std::ofstream(flags.json_path) << text << "\n";
  return ok ? 0 : 1;
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  setenv("UCX_LOG_FILE", "/dev/stderr", /*overwrite=*/0);  // stdout carries the JSON
  const size_t max_bytes = *std::max_element(flags.sizes_mib.begin(), flags.sizes_mib.end()) * kMiB;
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) {
    std::perror("pipe");
    return 1;
  }
  // Fork before any thread exists (UCX starts threads).
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    std::_Exit(RunReceiver(flags, max_bytes, to_child[0], to_parent[1]));
  }
  close(to_child[0]);
  close(to_parent[1]);
  const int rc = RunSender(flags, max_bytes, to_parent[0], to_child[1]);
  close(to_child[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace
}  // namespace tandem::transfer

int main(int argc, char** argv) { return tandem::transfer::Main(argc, argv); }
