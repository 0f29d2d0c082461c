// Forged destination and descriptor messages (block counts, sizes, offsets, geometry,
// truncated and garbage descriptor bytes) against the checks a prefill replica makes before
// writing (services/prefill/kv_destination.h), the descriptor parser and the transfer
// layer's own bounds: each is a clear error or a write inside the real pool, never a write
// outside it, never a crash; the same for destinations of a layout of several streams. Deterministic (fixed seeds). scripts/sanitize.sh runs it under
// AddressSanitizer, where the pool is a heap block of exactly its size, so any byte written
// past it is reported; canaries around it catch the same without ASan.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/transfer/in_process_transfer_engine.h"
#include "services/common/transfer/remote_memory_descriptor.h"
#include "services/common/transfer/ucx_support.h"
#include "services/prefill/kv_destination.h"

namespace tandem {
namespace {

constexpr KvPoolGeometry kLocal{.num_layers = 3, .num_blocks = 0, .block_size = 4, .entry_dim = 5, .bytes_per_value = 4};
constexpr int64_t kRealBlocks = 6;
constexpr size_t kPoolBytes = 3 * kRealBlocks * 4 * 5 * 4;
constexpr size_t kCanary = 512;

template <typename T>
T Pick(std::mt19937_64& rng, std::initializer_list<T> choices) {
  return *(choices.begin() + rng() % choices.size());
}

int64_t ForgedCount(std::mt19937_64& rng, int64_t real) {
  switch (rng() % 8) {
    case 0: return 0;
    case 1: return -1 - static_cast<int64_t>(rng() % 1000);
    case 2: return real + 1 + static_cast<int64_t>(rng() % 4);
    case 3: return Pick<int64_t>(rng, {int64_t{1} << 40, std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(), int64_t{1} << 62});
    case 4: return std::max<int64_t>(1, real - 1 - static_cast<int64_t>(rng() % 3));
    default: return real;
  }
}

TEST(KvDestinationFuzzTest, ForgedDestinationsNeverWriteOutsideThePool) {
  transfer::InProcessTransferEngine sender, receiver;
  // The pool in a buffer with canaries on both sides; only the pool is registered.
  std::vector<uint8_t> arena(kCanary + kPoolBytes + kCanary, 0xA5);
  uint8_t* pool = arena.data() + kCanary;
  // Under ASan the writes go to a block of exactly the pool's size instead.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[kPoolBytes]);
  std::mt19937_64 rng(20261201);
  std::vector<uint8_t> source(4096);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
  int accepted = 0, refused_by_check = 0, refused_by_transport = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    uint8_t* target = iter % 2 == 0 ? pool : exact.get();
    auto region = receiver.RegisterMemory(target, kPoolBytes);
    ASSERT_TRUE(region.ok()) << region.status();
    KvPoolGeometry g = kLocal;
    g.num_blocks = ForgedCount(rng, kRealBlocks);
    if (rng() % 6 == 0) g.block_size = ForgedCount(rng, kLocal.block_size);
    if (rng() % 6 == 0) g.entry_dim = ForgedCount(rng, kLocal.entry_dim);
    if (rng() % 8 == 0) g.num_layers = ForgedCount(rng, kLocal.num_layers);
    if (rng() % 10 == 0) g.bytes_per_value = Pick<int64_t>(rng, {2, 8, 0, -4});
    std::vector<int32_t> blocks(rng() % 10);
    for (int32_t& b : blocks) {
      b = rng() % 5 == 0 ? Pick<int32_t>(rng, {-1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
                                               static_cast<int32_t>(kRealBlocks), static_cast<int32_t>(g.num_blocks)})
                         : static_cast<int32_t>(rng() % kRealBlocks);
    }
    // The descriptor: the real one, or with its length or base forged (re-serialized, so
    // its checksum holds: a well-formed lie).
    transfer::RemoteMemoryDescriptor d = (*region)->descriptor();
    switch (rng() % 6) {
      case 0: d.length += 1 + rng() % 4096; break;
      case 1: d.length = Pick<uint64_t>(rng, {uint64_t{1} << 62, 0, kPoolBytes - 1}); break;
      case 2: d.base += Pick<uint64_t>(rng, {8, 4096}); break;
      case 3: d.base -= Pick<uint64_t>(rng, {8, 4096}); break;
      default: break;
    }
    absl::StatusOr<transfer::RemoteMemoryDescriptor> parsed = transfer::RemoteMemoryDescriptor::Parse(d.Serialize());
    const int64_t tokens = static_cast<int64_t>(rng() % 40) - 2;
    if (!parsed.ok()) {
      ++refused_by_check;
      continue;
    }
    const absl::Status check =
        CheckKvDestination({.pool = g, .block_ids = blocks, .region_bytes = parsed->length}, kLocal, tokens);
    if (!check.ok()) {
      EXPECT_TRUE(check.code() == absl::StatusCode::kInvalidArgument ||
                  check.code() == absl::StatusCode::kFailedPrecondition)
          << check;
      EXPECT_FALSE(check.message().empty());
      ++refused_by_check;
      continue;
    }
    // Accepted: write every position of every layer, as TransferKvSink does.
    auto batch = sender.NewBatch(*parsed);
    const size_t entry = static_cast<size_t>(g.entry_dim * g.bytes_per_value);
    absl::Status put;
    for (int64_t layer = 0; layer < g.num_layers && put.ok(); ++layer) {
      for (int64_t p = 0; p < tokens && put.ok(); ++p) {
        const uint64_t off = KvEntryOffset(g, layer, blocks[p / g.block_size], p % g.block_size);
        ASSERT_LT(off, parsed->length) << "an accepted destination's offset past its region";
        put = batch->Put(source.data() + (p * entry) % (source.size() - entry), entry, off);
      }
    }
    const absl::Status done = put.ok() ? batch->Wait(absl::Seconds(10)) : put;
    if (done.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(done.code(), absl::StatusCode::kInvalidArgument) << done;
      ++refused_by_transport;
    }
    for (size_t i = 0; i < kCanary; ++i) {
      ASSERT_EQ(arena[i], 0xA5) << "written before the pool (iteration " << iter << ")";
      ASSERT_EQ(arena[kCanary + kPoolBytes + i], 0xA5) << "written past the pool (iteration " << iter << ")";
    }
  }
  std::printf("forged destinations: %d written in bounds, %d refused by the checks, %d by the transport\n", accepted,
              refused_by_check, refused_by_transport);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused_by_check, 5000);
  EXPECT_GT(refused_by_transport, 100) << "no forged descriptor length or base reached the transport";
}

TEST(KvDestinationFuzzTest, ForgedStreamDestinationsNeverWriteOutsideThePool) {
  // A V4-like layout (a ring, per-window entries shorter and longer than a block, states):
  // whatever blocks, slots, slot counts, token counts and region length a destination
  // claims, an accepted one's extents all lie in the region it describes.
  const std::vector<KvStream> streams = {
      {.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing, .tokens = 4, .width = 3,
       .layers = {0, 1, 2}},
      {.name = "csa", .dtype = "bf16", .granularity = KvGranularity::kPerWindow, .tokens = 2, .width = 4,
       .layers = {1}},
      {.name = "hca", .dtype = "f32", .granularity = KvGranularity::kPerWindow, .tokens = 8, .width = 2,
       .layers = {2}},
      {.name = "state", .dtype = "f32", .granularity = KvGranularity::kSequenceState, .tokens = 3, .width = 2,
       .layers = {1, 2}},
  };
  const KvPool::Geometry real{.num_layers = 3, .block_size = 4, .num_blocks = 6, .num_sequence_slots = 3};
  const size_t pool_bytes = *KvPool::BytesFor(streams, real);
  std::vector<uint8_t> arena(kCanary + pool_bytes + kCanary, 0xA5);
  std::mt19937_64 rng(20261203);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    KvPool::Geometry g = real;
    g.num_blocks = ForgedCount(rng, real.num_blocks);
    g.num_sequence_slots = ForgedCount(rng, real.num_sequence_slots);
    if (rng() % 6 == 0) g.block_size = static_cast<int32_t>(ForgedCount(rng, real.block_size));
    if (rng() % 8 == 0) g.num_layers = static_cast<int32_t>(ForgedCount(rng, real.num_layers));
    std::vector<int32_t> blocks(rng() % 10);
    for (int32_t& b : blocks) {
      b = rng() % 5 == 0 ? Pick<int32_t>(rng, {-1, std::numeric_limits<int32_t>::max(), 6, 7})
                         : static_cast<int32_t>(rng() % real.num_blocks);
    }
    const int64_t slot = rng() % 5 == 0 ? Pick<int64_t>(rng, {-1, 3, 1 << 30}) : static_cast<int64_t>(rng() % 3);
    const uint64_t region = rng() % 4 == 0 ? Pick<uint64_t>(rng, {0, pool_bytes - 1, pool_bytes + 64, 1ull << 62})
                                           : pool_bytes;
    const int64_t tokens = static_cast<int64_t>(rng() % 40) - 2;
    absl::StatusOr<std::vector<KvExtent>> extents = CheckKvStreamDestination(
        {.pool = g, .block_ids = blocks, .state_slot = slot, .region_bytes = region}, streams,
        {.num_layers = real.num_layers, .block_size = real.block_size}, tokens);
    if (!extents.ok()) {
      EXPECT_TRUE(extents.status().code() == absl::StatusCode::kInvalidArgument ||
                  extents.status().code() == absl::StatusCode::kFailedPrecondition)
          << extents.status();
      ++refused;
      continue;
    }
    for (const KvExtent& e : *extents) {
      ASSERT_LE(e.offset + e.bytes, region) << "an accepted destination's extent past its region";
      // The region is the real pool when it is no larger (a larger claim is the transport's
      // to refuse, as for the latent layout).
      if (region <= pool_bytes) std::memset(arena.data() + kCanary + e.offset, 0x5A, e.bytes);
    }
    ++accepted;
    for (size_t i = 0; i < kCanary; ++i) {
      ASSERT_EQ(arena[i], 0xA5) << "written before the pool (iteration " << iter << ")";
      ASSERT_EQ(arena[kCanary + pool_bytes + i], 0xA5) << "written past the pool (iteration " << iter << ")";
    }
  }
  std::printf("forged stream destinations: %d in bounds, %d refused\n", accepted, refused);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 5000);
}

TEST(KvDestinationFuzzTest, TruncatedOrGarbageDescriptorsAreCleanErrors) {
  transfer::InProcessTransferEngine engine;
  std::vector<uint8_t> mem(4096);
  auto region = engine.RegisterMemory(mem.data(), mem.size());
  ASSERT_TRUE(region.ok());
  const std::string wire = (*region)->descriptor().Serialize();
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_EQ(transfer::RemoteMemoryDescriptor::Parse(wire.substr(0, n)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "truncated to " << n;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string bad = wire;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    if (rng() % 4 == 0) bad += std::string(rng() % 16 + 1, static_cast<char>(rng()));
    absl::StatusOr<transfer::RemoteMemoryDescriptor> d = transfer::RemoteMemoryDescriptor::Parse(bad);
    if (bad != wire) {
      EXPECT_FALSE(d.ok()) << "a corrupted descriptor parsed";
    }
  }
  for (int i = 0; i < 20000; ++i) {
    std::string garbage(rng() % 200, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    if (rng() % 3 == 0 && garbage.size() >= 5) garbage.replace(0, 5, std::string("TKVD\x01", 5));
    EXPECT_FALSE(transfer::RemoteMemoryDescriptor::Parse(garbage).ok());
  }
}

TEST(KvDestinationFuzzTest, SharedMemoryExtentIsTheMappingsNotTheClaim) {
  // What the UCX engine checks before copying into a peer's segment it mapped
  // (ucp_rkey_ptr checks nothing): the claimed range must lie in one shared mapping.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = 16 * page;
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  char* base = static_cast<char*>(shared);
  EXPECT_TRUE(transfer::internal::CheckSharedMapping(base, bytes).ok());
  EXPECT_TRUE(transfer::internal::CheckSharedMapping(base + page, bytes - page).ok());
  EXPECT_EQ(transfer::internal::CheckSharedMapping(base, bytes + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transfer::internal::CheckSharedMapping(base + page, bytes).code(), absl::StatusCode::kInvalidArgument);
  std::vector<char> heap(4096);
  EXPECT_EQ(transfer::internal::CheckSharedMapping(heap.data(), 16).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(munmap(base + 8 * page, 8 * page), 0);
  EXPECT_EQ(transfer::internal::CheckSharedMapping(base, bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transfer::internal::CheckSharedMapping(base + 8 * page, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(munmap(base, 8 * page), 0);
  // Garbage maps text: errors, no crash.
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string text(rng() % 300, '\0');
    for (char& c : text) c = "0123456789abcdef- rwxps\n/"[rng() % 25];
    (void)transfer::internal::CheckSharedMappingIn(text, rng() % 0x10000, rng() % 0x10000);
  }
  EXPECT_TRUE(transfer::internal::CheckSharedMappingIn("1000-3000 rw-s 0 0:1 7 /dev/shm/x\n", 0x1000, 0x2000).ok());
  EXPECT_FALSE(transfer::internal::CheckSharedMappingIn("1000-3000 rw-s 0 0:1 7 /dev/shm/x\n", 0x1000, 0x2001).ok());
  EXPECT_FALSE(transfer::internal::CheckSharedMappingIn("1000-3000 rw-p 0 0:1 7\n", 0x1000, 16).ok());
  EXPECT_FALSE(transfer::internal::CheckSharedMappingIn("1000-3000 r--s 0 0:1 7\n", 0x1000, 16).ok());
}

}  // namespace
}  // namespace tandem
