// CUDA IPC (engine/model/cuda/cuda_ipc.h) between two processes: a child process (this
// binary, re-executed with --cuda-ipc-child) allocates a KV pool, fills it with a sentinel
// and exports it; this process maps it and writes into it with KvBlockCopy; the child then
// checks every byte of its pool against the expected contents sent by this process and
// checksums its blocks the way a decode replica does. On one GPU, and from GPU 0 into a
// pool on GPU 1 where there are two GPUs with peer access. Plus the refusals: a descriptor
// from another host, a malformed one, a GPU that is not visible, a handle opened by the
// process that exported it. Cases that need a GPU skip, saying why, where there is none.
//
// The child is started with posix_spawn, which execs at once: nothing of this process's
// CUDA state is used in the child, so the parent may have initialized CUDA before.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/model/cuda/cuda_ipc.h"
#include "gtest/gtest.h"
#include "tests/support/gpu_test_main.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_block_copy.h"

extern char** environ;

namespace tandem::cuda_model {
namespace {

constexpr char kChildFlag[] = "--cuda-ipc-child";
constexpr unsigned char kSentinel = 0xc3;

// The pool of the test: [layer][block][slot][entry].
struct Geometry {
  int64_t layers = 3, blocks = 12, block_size = 16, entry_bytes = 1152;
  int64_t bytes() const { return layers * blocks * block_size * entry_bytes; }
};

// ---- Line and byte I/O over file descriptors, with a deadline. -----------------------------

class Channel {
 public:
  Channel(int in, int out) : in_(in), out_(out) {}
  bool Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = write(out_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool WriteLine(const std::string& line) { return Write((line + "\n").data(), line.size() + 1); }
  // Up to the next '\n' (not included); false on end of input, error or timeout.
  bool ReadLine(std::string* line, int timeout_ms) {
    while (true) {
      if (const size_t eol = pending_.find('\n'); eol != std::string::npos) {
        *line = pending_.substr(0, eol);
        pending_.erase(0, eol + 1);
        return true;
      }
      if (!Fill(timeout_ms)) return false;
    }
  }
  bool ReadExact(void* data, size_t n, int timeout_ms) {
    while (pending_.size() < n) {
      if (!Fill(timeout_ms)) return false;
    }
    std::memcpy(data, pending_.data(), n);
    pending_.erase(0, n);
    return true;
  }

 private:
  bool Fill(int timeout_ms) {
    pollfd p{in_, POLLIN, 0};
    int rc;
    do {
      rc = poll(&p, 1, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0) return false;
    char buf[65536];
    ssize_t n;
    do {
      n = read(in_, buf, sizeof(buf));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int in_, out_;
  std::string pending_;
};

std::string Encode(const IpcPoolDescriptor& d) {
  // Each byte field hex-encoded behind an 'x' so that an empty one stays a field.
  return absl::StrCat("DESC x", absl::BytesToHexString(d.host_id), " x", absl::BytesToHexString(d.device_uuid), " x",
                      absl::BytesToHexString(d.handle), " ", d.bytes, " ", d.pid);
}

bool Decode(const std::string& line, IpcPoolDescriptor* d) {
  std::istringstream in(line);
  std::string tag, host, uuid, handle;
  if (!(in >> tag >> host >> uuid >> handle >> d->bytes >> d->pid) || tag != "DESC") return false;
  d->host_id = absl::HexStringToBytes(host.substr(1));
  d->device_uuid = absl::HexStringToBytes(uuid.substr(1));
  d->handle = absl::HexStringToBytes(handle.substr(1));
  return true;
}

// ---- The child: owns and exports the pool, then checks what arrived. -----------------------

int Fail(Channel& ch, const std::string& why) {
  ch.WriteLine("ERROR " + why);
  return 1;
}

// argv: kChildFlag DEVICE. Protocol (stdin/stdout):
//   child  -> DESC <descriptor>
//   parent -> CHECK <layer_begin> <layer_end> <begin> <end> <table entries...>, then the
//             expected pool (Geometry().bytes() raw bytes)
//   child  -> RESULT <differing bytes> <first differing offset or -1> <checksum of its blocks>
int RunChild(int argc, char** argv) {
  Channel ch(STDIN_FILENO, STDOUT_FILENO);
  if (argc < 3) return Fail(ch, "usage: --cuda-ipc-child DEVICE");
  const int device = std::atoi(argv[2]);
  const Geometry g;
  if (cudaSetDevice(device) != cudaSuccess) return Fail(ch, "cudaSetDevice failed");
  void* pool = nullptr;
  if (cudaMalloc(&pool, g.bytes()) != cudaSuccess) return Fail(ch, "cudaMalloc failed");
  if (cudaMemset(pool, kSentinel, g.bytes()) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    return Fail(ch, "cudaMemset failed");
  }
  absl::StatusOr<IpcPoolDescriptor> d = ExportIpcPool(pool, g.bytes(), device);
  if (!d.ok()) return Fail(ch, d.status().ToString());
  ch.WriteLine(Encode(*d));

  std::string line;
  if (!ch.ReadLine(&line, 120000)) return Fail(ch, "no CHECK from the parent");
  std::istringstream in(line);
  std::string tag;
  int64_t layer_begin, layer_end, begin, end;
  if (!(in >> tag >> layer_begin >> layer_end >> begin >> end) || tag != "CHECK") return Fail(ch, "bad CHECK: " + line);
  std::vector<int32_t> table;
  for (int32_t id; in >> id;) table.push_back(id);
  std::vector<unsigned char> expected(g.bytes()), got(g.bytes());
  if (!ch.ReadExact(expected.data(), expected.size(), 120000)) return Fail(ch, "short expected pool");
  if (cudaMemcpy(got.data(), pool, got.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return Fail(ch, "cudaMemcpy failed");
  }
  int64_t differing = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differing;
    }
  }
  // The receiver's check: the checksum of its own blocks.
  int32_t* dev_table = nullptr;
  unsigned long long* sum = nullptr;
  unsigned long long host_sum = 0;
  if (cudaMalloc(&dev_table, std::max<size_t>(table.size(), 1) * 4) != cudaSuccess || cudaMalloc(&sum, 8) != cudaSuccess ||
      cudaMemcpy(dev_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemset(sum, 0, 8) != cudaSuccess) {
    return Fail(ch, "cannot set up the checksum");
  }
  cuda::KvBlockCopyParams p;
  p.src = pool;
  p.src_num_blocks = g.blocks;
  p.block_size = g.block_size;
  p.entry_bytes = g.entry_bytes;
  p.layer_begin = layer_begin;
  p.layer_end = layer_end;
  p.src_blocks = dev_table;
  p.begin = begin;
  p.end = end;
  p.checksum = sum;
  if (cuda::KvBlockCopy(p, nullptr) != cudaSuccess ||
      cudaMemcpy(&host_sum, sum, 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return Fail(ch, "checksum failed");
  }
  ch.WriteLine(absl::StrCat("RESULT ", differing, " ", first, " ", host_sum));
  cudaFree(dev_table);
  cudaFree(sum);
  cudaFree(pool);
  return 0;
}

// ---- The parent side. ---------------------------------------------------------------------------

// The child process and its pipes; killed and reaped on destruction if still running.
class Child {
 public:
  static std::unique_ptr<Child> Start(int device, std::string* error) {
    signal(SIGPIPE, SIG_IGN);
    char self[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
      *error = "readlink /proc/self/exe failed";
      return nullptr;
    }
    self[n] = '\0';
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
      *error = std::string("pipe: ") + std::strerror(errno);
      return nullptr;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
    const std::string dev = std::to_string(device);
    char* argv[] = {self, const_cast<char*>(kChildFlag), const_cast<char*>(dev.c_str()), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, self, &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    if (rc != 0) {
      close(to_child[1]);
      close(from_child[0]);
      *error = std::string("posix_spawn: ") + std::strerror(rc);
      return nullptr;
    }
    return std::unique_ptr<Child>(new Child(pid, from_child[0], to_child[1]));
  }
  ~Child() {
    close(to_);
    close(from_);
    int status = 0;
    for (int i = 0; i < 200; ++i) {  // 10 s to exit after its input closes
      if (waitpid(pid_, &status, WNOHANG) != 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  Channel& channel() { return channel_; }
  pid_t pid() const { return pid_; }

 private:
  Child(pid_t pid, int from, int to) : pid_(pid), from_(from), to_(to), channel_(from, to) {}
  pid_t pid_;
  int from_, to_;
  Channel channel_;
};

class CudaIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = cuda::QueryDevices(&devices_);
    if (!why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  }

  // The child's pool on `child_device`, written from `local_device` of this process.
  void RoundTrip(int child_device, int local_device) {
    const Geometry g;
    std::string error;
    std::unique_ptr<Child> child = Child::Start(child_device, &error);
    ASSERT_NE(child, nullptr) << error;
    std::string line;
    ASSERT_TRUE(child->channel().ReadLine(&line, 120000)) << "no descriptor from the child";
    IpcPoolDescriptor d;
    ASSERT_TRUE(Decode(line, &d)) << line;
    EXPECT_EQ(d.pid, child->pid());
    EXPECT_EQ(d.bytes, static_cast<uint64_t>(g.bytes()));
    EXPECT_EQ(d.host_id, HostId());
    EXPECT_FALSE(d.host_id.empty());

    // A descriptor claiming more than the exporter allocated is refused: the extent comes
    // from the mapping (cuMemGetAddressRange), not from the message.
    for (uint64_t claimed : {d.bytes + 1, d.bytes * 64, uint64_t{1} << 62}) {
      IpcPoolDescriptor forged = d;
      forged.bytes = claimed;
      absl::StatusOr<std::unique_ptr<IpcMapping>> bad = OpenIpcPool(forged, local_device);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << claimed << ": " << bad.status();
      EXPECT_NE(bad.status().message().find("claims"), std::string::npos) << bad.status();
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    }

    // Another device current while opening: it must be current again afterwards.
    const int other = devices_.size() > 1 ? 1 - local_device : local_device;
    ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
    absl::StatusOr<std::unique_ptr<IpcMapping>> m = OpenIpcPool(d, local_device);
    ASSERT_TRUE(m.ok()) << m.status();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, other);
    EXPECT_EQ((*m)->device(), local_device);
    EXPECT_EQ((*m)->same_device(), child_device == local_device);
    EXPECT_GE((*m)->bytes(), static_cast<uint64_t>(g.bytes()));  // the allocation's own extent
    ASSERT_NE((*m)->base(), nullptr);

    // A source pool here, random tables on both sides, an unaligned range of two layers.
    ASSERT_EQ(cudaSetDevice(local_device), cudaSuccess);
    std::mt19937_64 rng(child_device * 10 + local_device + 1);
    std::vector<unsigned char> src(g.bytes());
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    const int64_t layer_begin = 1, layer_end = 3, begin = 5, end = 9 * g.block_size + 7;
    const int64_t table_size = (end + g.block_size - 1) / g.block_size;
    std::vector<int32_t> ids(g.blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<int32_t> src_table(ids.begin(), ids.begin() + table_size);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<int32_t> dst_table(ids.begin(), ids.begin() + table_size);

    std::vector<unsigned char> expected(g.bytes(), kSentinel);
    uint64_t expected_sum = 0;
    auto at = [&](const std::vector<int32_t>& table, int64_t layer, int64_t pos) {
      return ((layer * g.blocks + table[pos / g.block_size]) * g.block_size + pos % g.block_size) * g.entry_bytes;
    };
    for (int64_t l = layer_begin; l < layer_end; ++l) {
      for (int64_t pos = begin; pos < end; ++pos) {
        std::memcpy(&expected[at(dst_table, l, pos)], &src[at(src_table, l, pos)], g.entry_bytes);
        expected_sum += cuda::KvEntryChecksum(l, pos, &src[at(src_table, l, pos)], g.entry_bytes);
      }
    }

    void *dev_src = nullptr, *dev_tables = nullptr, *dev_sum = nullptr;
    ASSERT_EQ(cudaMalloc(&dev_src, g.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_tables, 2 * table_size * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_sum, 8), cudaSuccess);
    int32_t* tables = static_cast<int32_t*>(dev_tables);
    ASSERT_EQ(cudaMemcpy(dev_src, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(tables, src_table.data(), table_size * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(tables + table_size, dst_table.data(), table_size * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(dev_sum, 0, 8), cudaSuccess);
    cuda::KvBlockCopyParams p;
    p.src = dev_src;
    p.dst = (*m)->base();
    p.src_num_blocks = g.blocks;
    p.dst_num_blocks = g.blocks;
    p.block_size = g.block_size;
    p.entry_bytes = g.entry_bytes;
    p.src_blocks = tables;
    p.dst_blocks = tables + table_size;
    p.begin = begin;
    p.end = end;
    p.checksum = static_cast<unsigned long long*>(dev_sum);
    for (int64_t l = layer_begin; l < layer_end; ++l) {  // layer by layer, as prefill does
      p.layer_begin = l;
      p.layer_end = l + 1;
      ASSERT_EQ(cuda::KvBlockCopy(p, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    uint64_t sent_sum = 0;
    ASSERT_EQ(cudaMemcpy(&sent_sum, dev_sum, 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(sent_sum, expected_sum);
    m->reset();  // unmapped before the child looks (and frees)
    cudaFree(dev_src);
    cudaFree(dev_tables);
    cudaFree(dev_sum);

    std::string check = absl::StrCat("CHECK ", layer_begin, " ", layer_end, " ", begin, " ", end);
    for (int32_t id : dst_table) absl::StrAppend(&check, " ", id);
    ASSERT_TRUE(child->channel().WriteLine(check));
    ASSERT_TRUE(child->channel().Write(expected.data(), expected.size()));
    ASSERT_TRUE(child->channel().ReadLine(&line, 120000)) << "no result from the child";
    std::istringstream in(line);
    std::string tag;
    int64_t differing = -1, first = -1;
    uint64_t received_sum = 0;
    ASSERT_TRUE(in >> tag >> differing >> first >> received_sum && tag == "RESULT") << line;
    EXPECT_EQ(differing, 0) << "first differing byte at offset " << first;
    EXPECT_EQ(received_sum, expected_sum);
  }

  std::vector<cuda::DeviceInfo> devices_;
};

TEST_F(CudaIpcTest, TwoProcessesOneGpu) { RoundTrip(0, 0); }

TEST_F(CudaIpcTest, TwoProcessesPeerGpus) {
  if (devices_.size() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << devices_.size();
  int can = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
  if (!can) GTEST_SKIP() << "GPU 0 has no peer access to GPU 1";
  RoundTrip(1, 0);
}

TEST_F(CudaIpcTest, OpeningInTheExportingProcessFails) {
  void* pool = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&pool, 1 << 20), cudaSuccess);
  absl::StatusOr<IpcPoolDescriptor> d = ExportIpcPool(pool, 1 << 20, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->pid, getpid());
  EXPECT_EQ(d->handle.size(), 64u);
  EXPECT_EQ(d->device_uuid.size(), 16u);
  absl::StatusOr<std::unique_ptr<IpcMapping>> m = OpenIpcPool(*d, 0);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // no error left behind
  // The allocation is still usable.
  EXPECT_EQ(cudaMemset(pool, 0, 1 << 20), cudaSuccess);
  EXPECT_EQ(cudaFree(pool), cudaSuccess);
}

TEST_F(CudaIpcTest, ExportRefusesWhatIsNotDeviceMemory) {
  std::vector<char> host(4096);
  EXPECT_EQ(ExportIpcPool(host.data(), host.size(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportIpcPool(nullptr, 4096, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaIpcTest, InvisibleGpuAndMissingDevice) {
  IpcPoolDescriptor d;
  d.host_id = HostId();
  d.device_uuid = std::string(16, '\xee');
  d.handle = std::string(64, '\x01');
  d.bytes = 4096;
  absl::StatusOr<std::unique_ptr<IpcMapping>> m = OpenIpcPool(d, 0);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_NE(m.status().message().find("not visible"), std::string::npos) << m.status();
  EXPECT_EQ(OpenIpcPool(d, static_cast<int>(devices_.size())).status().code(), absl::StatusCode::kInvalidArgument);
}

// Host-only cases: refused before any CUDA call.
TEST(CudaIpcDescriptorTest, AnotherHostIsRefused) {
  IpcPoolDescriptor d;
  d.host_id = "00000000-another-machine";
  d.device_uuid = std::string(16, '\0');
  d.handle = std::string(64, '\0');
  d.bytes = 4096;
  d.pid = 1;
  absl::StatusOr<std::unique_ptr<IpcMapping>> m = OpenIpcPool(d, 0);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
}

TEST(CudaIpcDescriptorTest, MalformedDescriptorsAreInvalid) {
  IpcPoolDescriptor good;
  good.host_id = HostId();
  good.device_uuid = std::string(16, '\0');
  good.handle = std::string(64, '\0');
  good.bytes = 4096;
  IpcPoolDescriptor d = good;
  d.handle.resize(63);
  EXPECT_EQ(OpenIpcPool(d, 0).status().code(), absl::StatusCode::kInvalidArgument);
  d.handle = std::string(65, '\0');
  EXPECT_EQ(OpenIpcPool(d, 0).status().code(), absl::StatusCode::kInvalidArgument);
  d = good;
  d.device_uuid = "GPU-1234";
  EXPECT_EQ(OpenIpcPool(d, 0).status().code(), absl::StatusCode::kInvalidArgument);
  d = good;
  d.bytes = 0;
  EXPECT_EQ(OpenIpcPool(d, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenIpcPool(good, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaIpcDescriptorTest, HostIdIsTheBootId) {
  const std::string id = HostId();
  if (id.empty()) GTEST_SKIP() << "/proc/sys/kernel/random/boot_id is not readable here";
  EXPECT_EQ(id.size(), 36u) << id;  // a UUID in text
  EXPECT_EQ(id, HostId());
}

}  // namespace
}  // namespace tandem::cuda_model

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], tandem::cuda_model::kChildFlag) == 0) {
    return tandem::cuda_model::RunChild(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return tandem::testing::RunGpuTests();  // 77 when every case skipped (no GPU)
}
