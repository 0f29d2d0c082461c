// The device-to-device KV transfer path (docs/design.md §5) against a plain peer copy measured
// in the same run (bench/README.md):
//  - the path as the engine uses it: a child process (this binary, re-executed) owns the
//    destination KV pool on --dst-device and exports it over CUDA IPC (cuda_ipc.h); this
//    process maps it and, with its source pool on --src-device, runs KvBlockCopy
//    (kv_block_copy.h) once per layer (27 layers, 1152-byte entries, 64-slot blocks,
//    random block permutations on both sides) with the checksum on (`kv_per_layer`), off
//    (`kv_per_layer_nosum`), with programmatic dependent launch on (`kv_per_layer_pdl`),
//    in the engine's groups of layers (`kv_engine`: KvCopyLayersPerLaunch, what
//    cuda_peer_kv.cc issues; the acceptance figure) and as one call over all layers
//    (`kv_all_layers`);
//  - the reference: cudaMemcpyPeerAsync of the same number of bytes between contiguous
//    buffers on the same two devices (peer access enabled), or cudaMemcpyAsync D2D when
//    both are one device.
// Each measurement: a 1 GiB memset keeps the GPU busy while the whole batch is enqueued,
// so that CUDA events around the batch time the GPU's work and not the host's launch rate
// (the engine enqueues these copies ahead, between layers of its forward pass); `late`
// counts measurements where the memset ended first. Median of --reps after --warmup,
// variants interleaved rep by rep.
// GB/s = payload bytes (positions x layers x 1152) / time / 1e9; ratio = path / reference.
// After each size the child checksums its own blocks (the receiver's check) and the value
// must equal what the sender summed while copying.
//
//   kv_peer_copy_bench [--src-device N] [--dst-device N] [--reps N] [--warmup N]
//                      [--sizes 1,4,16,64,256,1024] [--json FILE]
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
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "bench/cuda_check.h"
#include "engine/model/cuda/cuda_ipc.h"
#include "kernels/cuda/kv_block_copy.h"
#include "kernels/cuda/launch_control.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;
using cuda_model::IpcPoolDescriptor;

constexpr int64_t kLayers = 27;
constexpr int64_t kEntryBytes = 1152;  // 576 bf16: kv_lora_rank 512 + rope 64
constexpr int64_t kBlockSize = 64;
constexpr char kChildFlag[] = "--child";

int64_t PoolBytes(int64_t blocks) { return kLayers * blocks * kBlockSize * kEntryBytes; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ---- Lines over pipes. ------------------------------------------------------------------------

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ReadLine(int fd, std::string* pending, std::string* line, int timeout_ms) {
  while (true) {
    if (const size_t eol = pending->find('\n'); eol != std::string::npos) {
      *line = pending->substr(0, eol);
      pending->erase(0, eol + 1);
      return true;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = poll(&p, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending->append(buf, static_cast<size_t>(n));
  }
}

// ---- The child: the receiver (a decode replica) owning the destination pool. ------------------

// argv: --child DEVICE BLOCKS. Writes "DESC ..." then answers "SUM <positions> <ids...>"
// with "SUM <checksum of those blocks' positions [0, positions) of every layer>", until
// "QUIT" or the end of its input.
int RunChild(int argc, char** argv) {
  if (argc < 4) return 2;
  const int device = std::atoi(argv[2]);
  const int64_t blocks = std::atoll(argv[3]);
  CHECK_CUDA(cudaSetDevice(device));
  void* pool = nullptr;
  CHECK_CUDA(cudaMalloc(&pool, PoolBytes(blocks)));
  CHECK_CUDA(cudaMemset(pool, 0, PoolBytes(blocks)));
  int32_t* table = nullptr;
  unsigned long long* sum = nullptr;
  CHECK_CUDA(cudaMalloc(&table, blocks * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&sum, sizeof(unsigned long long)));
  CHECK_CUDA(cudaDeviceSynchronize());
  absl::StatusOr<IpcPoolDescriptor> d = cuda_model::ExportIpcPool(pool, PoolBytes(blocks), device);
  if (!d.ok()) {
    std::fprintf(stderr, "child: %s\n", d.status().ToString().c_str());
    return 1;
  }
  WriteAll(STDOUT_FILENO, absl::StrCat("DESC x", absl::BytesToHexString(d->host_id), " x",
                                       absl::BytesToHexString(d->device_uuid), " x", absl::BytesToHexString(d->handle),
                                       " ", d->bytes, " ", d->pid, "\n"));
  std::string pending, line;
  while (ReadLine(STDIN_FILENO, &pending, &line, -1)) {
    std::istringstream in(line);
    std::string tag;
    int64_t positions = 0;
    if (!(in >> tag) || tag == "QUIT") break;
    if (tag != "SUM" || !(in >> positions)) return 2;
    std::vector<int32_t> ids;
    for (int32_t id; in >> id;) ids.push_back(id);
    CHECK_CUDA(cudaMemcpy(table, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(sum, 0, sizeof(unsigned long long)));
    cuda::KvBlockCopyParams p;
    p.src = pool;
    p.src_num_blocks = blocks;
    p.block_size = kBlockSize;
    p.entry_bytes = kEntryBytes;
    p.layer_begin = 0;
    p.layer_end = kLayers;
    p.src_blocks = table;
    p.begin = 0;
    p.end = positions;
    p.checksum = sum;
    CHECK_CUDA(cuda::KvBlockCopy(p, nullptr));
    unsigned long long value = 0;
    CHECK_CUDA(cudaMemcpy(&value, sum, sizeof(value), cudaMemcpyDeviceToHost));
    WriteAll(STDOUT_FILENO, absl::StrCat("SUM ", value, "\n"));
  }
  return 0;
}

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string pending;
};

Child StartChild(int device, int64_t blocks) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::fprintf(stderr, "readlink /proc/self/exe failed\n");
    std::exit(1);
  }
  self[n] = '\0';
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(1);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  const std::string dev = std::to_string(device), nb = std::to_string(blocks);
  char* argv[] = {self, const_cast<char*>(kChildFlag), const_cast<char*>(dev.c_str()), const_cast<char*>(nb.c_str()),
                  nullptr};
  Child c;
  const int rc = posix_spawn(&c.pid, self, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    std::fprintf(stderr, "posix_spawn: %s\n", std::strerror(rc));
    std::exit(1);
  }
  c.to = to_child[1];
  c.from = from_child[0];
  return c;
}

void StopChild(Child& c) {
  WriteAll(c.to, "QUIT\n");
  close(c.to);
  close(c.from);
  int status = 0;
  for (int i = 0; i < 200 && waitpid(c.pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (waitpid(c.pid, &status, WNOHANG) == 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  }
}

// ---- Timing: keep the GPU busy while the batch is enqueued, time between events. -------------

// Each measurement first enqueues a large memset on a scratch buffer (about 0.4 ms of GPU
// work), then event a, the batch, event b: the host has enqueued the whole batch before
// the GPU reaches event a, so a..b is the GPU's time for the batch, not the host's launch
// rate. (A host function holding the stream deadlocked on the H200 machine.) If event a
// has already completed when the host finishes enqueuing, the lead was too short for that
// measurement: counted in late().
class Timer {
 public:
  Timer(cudaStream_t s, size_t scratch_bytes) : stream_(s), scratch_bytes_(scratch_bytes) {
    CHECK_CUDA(cudaEventCreate(&a_));
    CHECK_CUDA(cudaEventCreate(&b_));
    CHECK_CUDA(cudaMalloc(&scratch_, scratch_bytes_));
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
    cudaFree(scratch_);
  }
  // Milliseconds of GPU time for what `enqueue` puts on the stream.
  double Measure(const std::function<void()>& enqueue) {
    CHECK_CUDA(cudaMemsetAsync(scratch_, ++fill_, scratch_bytes_, stream_));
    CHECK_CUDA(cudaEventRecord(a_, stream_));
    enqueue();
    CHECK_CUDA(cudaEventRecord(b_, stream_));
    const cudaError_t q = cudaEventQuery(a_);
    if (q == cudaSuccess) {
      ++late_;
    } else if (q != cudaErrorNotReady) {
      CHECK_CUDA(q);
    }
    CHECK_CUDA(cudaEventSynchronize(b_));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a_, b_));
    return ms;
  }
  int64_t late() const { return late_; }

 private:
  cudaStream_t stream_;
  size_t scratch_bytes_;
  void* scratch_ = nullptr;
  cudaEvent_t a_, b_;
  int fill_ = 0;
  int64_t late_ = 0;
};

std::string DeviceName(int device) {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::vector<int32_t> RandomBlocks(int64_t pool_blocks, int64_t n, std::mt19937_64& rng) {
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n);
  return ids;
}

int Main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], kChildFlag) == 0) return RunChild(argc, argv);
  int src_device = 0, dst_device = -1, reps = 20, warmup = 3;
  std::vector<int64_t> sizes_mib = {1, 4, 16, 64, 256, 1024};
  std::string json_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--src-device") src_device = std::stoi(next());
    else if (a == "--dst-device") dst_device = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--json") json_file = next();
    else if (a == "--sizes") {
      sizes_mib.clear();
      std::stringstream ss(next());
      for (std::string item; std::getline(ss, item, ',');) sizes_mib.push_back(std::stoll(item));
    } else {
      const bool help = a == "--help" || a == "-h";
      std::fprintf(help ? stdout : stderr,
                   "usage: kv_peer_copy_bench [--src-device N] [--dst-device N] [--reps N] [--warmup N]\n"
                   "                          [--sizes 1,4,16,64,256,1024] [--json FILE]\n"
                   "KvBlockCopy into a CUDA IPC mapping of a child process's KV pool (27 layers x 1152-byte\n"
                   "entries, 64-slot blocks), once per layer, against cudaMemcpyPeerAsync of the same bytes.\n"
                   "Defaults: source device 0, destination device 1 when there are two GPUs (else 0).\n");
      return help ? 0 : 2;
    }
  }
  int device_count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&device_count));
  if (dst_device < 0) dst_device = device_count >= 2 ? 1 : 0;
  if (src_device < 0 || src_device >= device_count || dst_device >= device_count || reps < 1 ||
      sizes_mib.empty()) {
    std::fprintf(stderr, "bad devices (%d visible), reps or sizes\n", device_count);
    return 2;
  }
  const bool peer = src_device != dst_device;
  const int64_t max_positions = *std::max_element(sizes_mib.begin(), sizes_mib.end()) * (int64_t{1} << 20) /
                                (kLayers * kEntryBytes);
  const int64_t max_blocks = (max_positions + kBlockSize - 1) / kBlockSize;
  const int64_t pool_blocks = max_blocks + max_blocks / 8 + 8;  // spare blocks: the tables are scattered

  // The receiver first, so that its CUDA context is up while this one starts.
  signal(SIGPIPE, SIG_IGN);
  Child child = StartChild(dst_device, pool_blocks);
  std::string line;
  if (!ReadLine(child.from, &child.pending, &line, 120000)) {
    std::fprintf(stderr, "no descriptor from the child\n");
    return 1;
  }
  IpcPoolDescriptor desc;
  {
    std::istringstream in(line);
    std::string tag, host, uuid, handle;
    if (!(in >> tag >> host >> uuid >> handle >> desc.bytes >> desc.pid) || tag != "DESC") {
      std::fprintf(stderr, "bad descriptor line: %s\n", line.c_str());
      return 1;
    }
    desc.host_id = absl::HexStringToBytes(host.substr(1));
    desc.device_uuid = absl::HexStringToBytes(uuid.substr(1));
    desc.handle = absl::HexStringToBytes(handle.substr(1));
  }
  absl::StatusOr<std::unique_ptr<cuda_model::IpcMapping>> mapping = cuda_model::OpenIpcPool(desc, src_device);
  if (!mapping.ok()) {
    std::fprintf(stderr, "OpenIpcPool: %s\n", mapping.status().ToString().c_str());
    StopChild(child);
    return 1;
  }

  CHECK_CUDA(cudaSetDevice(src_device));
  if (peer) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(dst_device, 0);  // for the reference copy
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      CHECK_CUDA(e);
    }
  }
  const size_t max_bytes = static_cast<size_t>(max_positions * kLayers * kEntryBytes);
  void *src_pool = nullptr, *ref_src = nullptr, *ref_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src_pool, PoolBytes(pool_blocks)));
  CHECK_CUDA(cudaMalloc(&ref_src, max_bytes));
  {
    std::vector<uint64_t> host(PoolBytes(pool_blocks) / 8);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (uint64_t& v : host) {  // xorshift64: arbitrary bytes, cheaply
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v = x;
    }
    CHECK_CUDA(cudaMemcpy(src_pool, host.data(), host.size() * 8, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(ref_src, host.data(), max_bytes, cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaSetDevice(dst_device));
  CHECK_CUDA(cudaMalloc(&ref_dst, max_bytes));
  CHECK_CUDA(cudaSetDevice(src_device));
  int32_t* tables = nullptr;  // source table, then destination table
  unsigned long long* sum = nullptr;
  CHECK_CUDA(cudaMalloc(&tables, 2 * pool_blocks * sizeof(int32_t)));
  CHECK_CUDA(cudaMalloc(&sum, sizeof(unsigned long long)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Timer timer(stream, size_t{1} << 30);

  std::printf("kv_peer_copy_bench: source %s (device %d), destination %s (device %d) in process %d over CUDA IPC%s\n",
              DeviceName(src_device).c_str(), src_device, DeviceName(dst_device).c_str(), dst_device,
              static_cast<int>(desc.pid), (*mapping)->same_device() ? " (same device)" : " (peer)");
  std::fflush(stdout);

  Json out;
  out["benchmark"] = "kv_peer_copy";
  out["src_device"] = {{"index", src_device}, {"name", DeviceName(src_device)}};
  out["dst_device"] = {{"index", dst_device}, {"name", DeviceName(dst_device)}};
  out["reference"] = peer ? "cudaMemcpyPeerAsync, contiguous, peer access enabled" : "cudaMemcpyAsync D2D, contiguous";
  out["geometry"] = {{"layers", kLayers}, {"entry_bytes", kEntryBytes}, {"block_size", kBlockSize},
                     {"pool_blocks", pool_blocks}};
  out["reps"] = reps;
  out["warmup"] = warmup;
  out["timing"] =
      "CUDA events around the batch, enqueued while a 1 GiB memset keeps the GPU busy; median of reps; GB/s = 1e9 B/s "
      "of payload";
  Json results = Json::array();
  Json acceptance = Json::object();
  bool all_verified = true;

  std::mt19937_64 rng(42);
  for (const int64_t mib : sizes_mib) {
    const int64_t positions = mib * (int64_t{1} << 20) / (kLayers * kEntryBytes);
    if (positions <= 0) continue;
    const int64_t bytes = positions * kLayers * kEntryBytes;
    const int64_t blocks = (positions + kBlockSize - 1) / kBlockSize;
    const std::vector<int32_t> src_ids = RandomBlocks(pool_blocks, blocks, rng);
    const std::vector<int32_t> dst_ids = RandomBlocks(pool_blocks, blocks, rng);
    CHECK_CUDA(cudaMemcpy(tables, src_ids.data(), blocks * sizeof(int32_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(tables + pool_blocks, dst_ids.data(), blocks * sizeof(int32_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());  // pageable uploads may return before they land

    cuda::KvBlockCopyParams p;
    p.src = src_pool;
    p.dst = (*mapping)->base();
    p.src_num_blocks = pool_blocks;
    p.dst_num_blocks = pool_blocks;
    p.block_size = kBlockSize;
    p.entry_bytes = kEntryBytes;
    p.src_blocks = tables;
    p.dst_blocks = tables + pool_blocks;
    p.begin = 0;
    p.end = positions;
    p.checksum = sum;
    auto per_layer = [&](bool with_sum, bool pdl) {
      return [&, with_sum, pdl] {
        cuda::ScopedProgrammaticLaunch scoped(pdl);
        cuda::KvBlockCopyParams q = p;
        if (!with_sum) q.checksum = nullptr;
        for (int64_t l = 0; l < kLayers; ++l) {
          q.layer_begin = l;
          q.layer_end = l + 1;
          CHECK_CUDA(cuda::KvBlockCopy(q, stream));
        }
      };
    };
    struct Variant {
      const char* name;
      std::function<void()> enqueue;
      std::vector<double> ms;
    };
    std::vector<Variant> variants;
    variants.push_back({"reference", [&] {
                          if (peer) {
                            CHECK_CUDA(cudaMemcpyPeerAsync(ref_dst, dst_device, ref_src, src_device, bytes, stream));
                          } else {
                            CHECK_CUDA(cudaMemcpyAsync(ref_dst, ref_src, bytes, cudaMemcpyDeviceToDevice, stream));
                          }
                        }, {}});
    variants.push_back({"kv_per_layer", per_layer(true, false), {}});
    variants.push_back({"kv_per_layer_nosum", per_layer(false, false), {}});
    variants.push_back({"kv_per_layer_pdl", per_layer(true, true), {}});
    // As the engine issues it (cuda_peer_kv.cc): groups of KvCopyLayersPerLaunch layers.
    variants.push_back({"kv_engine", [&] {
                          cuda::KvBlockCopyParams q = p;
                          const int64_t group = cuda::KvCopyLayersPerLaunch(positions * kEntryBytes);
                          for (int64_t l = 0; l < kLayers; l += group) {
                            q.layer_begin = l;
                            q.layer_end = std::min<int64_t>(kLayers, l + group);
                            CHECK_CUDA(cuda::KvBlockCopy(q, stream));
                          }
                        }, {}});
    variants.push_back({"kv_all_layers", [&] {
                          cuda::KvBlockCopyParams q = p;
                          q.layer_begin = 0;
                          q.layer_end = kLayers;
                          CHECK_CUDA(cuda::KvBlockCopy(q, stream));
                        }, {}});
    for (int rep = 0; rep < warmup + reps; ++rep) {
      for (Variant& v : variants) {
        const double ms = timer.Measure(v.enqueue);
        if (rep >= warmup) v.ms.push_back(ms);
      }
    }
    // The sender's checksum of one copy, against the receiver's check over its blocks.
    CHECK_CUDA(cudaMemsetAsync(sum, 0, sizeof(unsigned long long), stream));
    per_layer(true, false)();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    unsigned long long sent = 0, all_layers = 0;
    CHECK_CUDA(cudaMemcpy(&sent, sum, sizeof(sent), cudaMemcpyDeviceToHost));  // after the stream's sync
    CHECK_CUDA(cudaMemsetAsync(sum, 0, sizeof(unsigned long long), stream));
    variants.back().enqueue();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(&all_layers, sum, sizeof(all_layers), cudaMemcpyDeviceToHost));
    std::string request = absl::StrCat("SUM ", positions);
    for (int32_t id : dst_ids) absl::StrAppend(&request, " ", id);
    unsigned long long received = 0;
    if (!WriteAll(child.to, request + "\n") || !ReadLine(child.from, &child.pending, &line, 120000) ||
        std::sscanf(line.c_str(), "SUM %llu", &received) != 1) {
      std::fprintf(stderr, "no checksum from the child\n");
      StopChild(child);
      return 1;
    }
    const bool verified = sent == received && all_layers == sent;
    all_verified = all_verified && verified;

    const double ref_ms = Median(variants[0].ms);
    const double ref_gbs = bytes / (ref_ms * 1e-3) / 1e9;
    Json r = {{"size_mib", mib},
              {"bytes", bytes},
              {"positions", positions},
              {"blocks_per_layer", blocks},
              {"reference_ms", ref_ms},
              {"reference_gbs", ref_gbs}};
    std::string summary = absl::StrCat(mib, " MiB (", positions, " positions): reference ");
    absl::StrAppend(&summary, static_cast<int>(ref_gbs + 0.5), " GB/s");
    for (size_t i = 1; i < variants.size(); ++i) {
      const double ms = Median(variants[i].ms);
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      r[variants[i].name] = {{"ms", ms},
                             {"gbs", gbs},
                             {"ratio", gbs / ref_gbs},
                             {"ms_min", *std::min_element(variants[i].ms.begin(), variants[i].ms.end())},
                             {"ms_max", *std::max_element(variants[i].ms.begin(), variants[i].ms.end())}};
      char buf[128];
      std::snprintf(buf, sizeof(buf), "; %s %.0f GB/s = %.2f", variants[i].name, gbs, gbs / ref_gbs);
      summary += buf;
    }
    r["checksum_sender"] = sent;
    r["checksum_receiver"] = received;
    r["checksum_verified"] = verified;
    summary += verified ? "; checksum verified" : "; CHECKSUM MISMATCH";
    std::printf("%s\n", summary.c_str());
    std::fflush(stdout);
    if (mib >= 16) {
      acceptance[absl::StrCat("kv_engine_ratio_ge_0.8_at_", mib, "MiB")] = r["kv_engine"]["ratio"].get<double>() >= 0.8;
    }
    results.push_back(r);
  }
  acceptance["checksums_verified"] = all_verified;
  out["late_measurements"] = timer.late();
  out["results"] = results;
  out["acceptance"] = acceptance;

  mapping->reset();
  StopChild(child);
  cudaFree(src_pool);
  cudaFree(ref_src);
  cudaFree(tables);
  cudaFree(sum);
  cudaSetDevice(dst_device);
  cudaFree(ref_dst);

  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    f << text << "\n";
  }
  return all_verified ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
