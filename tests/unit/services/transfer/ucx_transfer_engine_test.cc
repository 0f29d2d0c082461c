// The UCX engine between two processes: this test is the sender (a prefill replica), a
// transfer_test_peer child process is the receiver (a decode replica). ctest runs it once
// over tcp on loopback and once over shared memory (see CMakeLists.txt).
#include "services/common/transfer/ucx_transfer_engine.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/transfer/event.h"
#include "tests/unit/services/transfer/peer_process.h"
#include "tests/unit/services/transfer/transfer_test_pattern.h"

namespace tandem::transfer {
namespace {

using testing::FillPattern;
using testing::PeerProcess;
using testing::Range;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kKvPiece = 64 * 576 * 4;  // 64 tokens x 576 floats: one block of one layer

std::string Tls() {
  const char* tls = std::getenv("UCX_TLS");
  return tls == nullptr ? "(default)" : tls;
}

// The sender's copy of the destination image: a put of [off, off + len) sends
// image + off, so what lands must be the pattern at the destination offsets.
std::vector<uint8_t> Image(uint64_t seed, size_t bytes) {
  std::vector<uint8_t> image(bytes);
  FillPattern(seed, 0, image.data(), image.size());
  return image;
}

std::unique_ptr<UcxTransferEngine> NewEngine() {
  auto engine = UcxTransferEngine::Create();
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

std::unique_ptr<PeerProcess> NewPeer(size_t bytes, bool register_memory = false) {
  auto peer = PeerProcess::Spawn(bytes, register_memory);
  EXPECT_TRUE(peer.ok()) << peer.status();
  return peer.ok() ? *std::move(peer) : nullptr;
}

absl::Status PutRanges(TransferBatch& batch, const std::vector<uint8_t>& image,
                       const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    absl::Status s = batch.Put(image.data() + r.offset, r.length, r.offset);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(UcxTransferEngineTest, RegistersMemoryAndDescribesIt) {
  auto engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_FALSE(engine->address().empty());
  std::vector<uint8_t> buffer(kMiB);
  auto region = engine->RegisterMemory(buffer.data(), buffer.size());
  ASSERT_TRUE(region.ok()) << region.status();
  const RemoteMemoryDescriptor& d = (*region)->descriptor();
  EXPECT_EQ(d.transport, "ucx");
  EXPECT_EQ(d.engine_address, engine->address());
  EXPECT_EQ(d.base, reinterpret_cast<uint64_t>(buffer.data()));
  EXPECT_EQ(d.length, buffer.size());
  auto parsed = RemoteMemoryDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, d);
  EXPECT_EQ(engine->RegisterMemory(nullptr, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UcxTransferEngineTest, AllocatesZeroedMemory) {
  auto engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  auto region = engine->AllocateMemory(3 * kMiB + 5);
  ASSERT_TRUE(region.ok()) << region.status();
  const auto* p = static_cast<const uint8_t*>((*region)->base());
  EXPECT_EQ(std::count(p, p + (*region)->length(), 0), static_cast<long>(3 * kMiB + 5));
  EXPECT_EQ((*region)->descriptor().base, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ((*region)->descriptor().length, 3 * kMiB + 5);
  EXPECT_EQ(engine->AllocateMemory(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UcxTransferEngineTest, BadUcxSettingIsACleanError) {
  UcxTransferEngine::Options options;
  options.ucx_config = {{"ZCOPY_THRESH", "not-a-size"}};
  auto engine = UcxTransferEngine::Create(options);
  EXPECT_FALSE(engine.ok());
}

// A registered heap buffer (not AllocateMemory) as the destination: written over tcp; with
// shared memory only it is refused up front (see ucx_transfer_engine.h), never a hang.
TEST(UcxTransferEngineTest, RegisteredHeapDestination) {
  constexpr size_t kBytes = 8 * kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes, /*register_memory=*/true);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const std::vector<uint8_t> image = Image(31, kBytes);
  std::vector<Range> ranges;
  for (uint64_t off = 0; off + kKvPiece <= kBytes; off += 2 * kKvPiece) {
    ranges.push_back(Range{off, kKvPiece});
  }
  auto batch = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*batch, image, ranges).ok());
  absl::Status status = batch->Wait(absl::Seconds(60));
  std::printf("UCX_TLS=%s: registered heap destination -> %s\n", Tls().c_str(),
              status.ToString().c_str());
  if (!engine->peer_failure_detection()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    ranges.clear();
  } else {
    ASSERT_TRUE(status.ok()) << status;
  }
  auto verdict = peer->Verify(31, ranges);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");
}

TEST(UcxTransferEngineTest, PutsLandByteExactInAnotherProcess) {
  constexpr size_t kBytes = 64 * kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const uint64_t seed = 17;
  const std::vector<uint8_t> image = Image(seed, kBytes);

  // Many small puts (odd sizes and offsets) in the first 8 MiB, KV-block-sized puts in the
  // next 24 MiB, and a few large puts in the last 32 MiB: 64 MiB at most in all.
  std::vector<Range> ranges;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 3000; ++i) {
    ranges.push_back(Range{rng() % (8 * kMiB - 5000), 1 + rng() % 4096});
  }
  for (uint64_t off = 8 * kMiB; off + kKvPiece <= 32 * kMiB; off += kKvPiece + 4096) {
    ranges.push_back(Range{off, kKvPiece});
  }
  ranges.push_back(Range{32 * kMiB + 3, 8 * kMiB - 3});
  ranges.push_back(Range{40 * kMiB, 8 * kMiB});
  ranges.push_back(Range{48 * kMiB + 1, 16 * kMiB - 1});

  auto batch = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*batch, image, ranges).ok());
  const size_t first_puts = batch->num_puts();  // the last two large ranges merge
  EXPECT_EQ(first_puts, ranges.size() - 1);
  const absl::Time start = absl::Now();
  absl::Status status = batch->Wait(absl::Seconds(120));
  ASSERT_TRUE(status.ok()) << status << " (UCX_TLS=" << Tls() << ")";
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("UCX_TLS=%s: %zu puts, %.1f MiB in %.3f s\n", Tls().c_str(), first_puts,
              batch->bytes() / double(kMiB), seconds);

  auto verdict = peer->Verify(seed, ranges);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");

  // Again into a cleared buffer: the endpoint and unpacked rkey are reused.
  ASSERT_TRUE(peer->Clear().ok());
  batch = engine->NewBatch(peer->descriptor());
  const std::vector<Range> whole = {Range{0, kBytes}};
  ASSERT_TRUE(PutRanges(*batch, image, whole).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(120)).ok());
  verdict = peer->Verify(seed, whole);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");

  const TransferStats stats = engine->stats();
  EXPECT_EQ(stats.batches_ok, 2u);
  EXPECT_EQ(stats.batches_failed, 0u);
  EXPECT_EQ(stats.endpoints_created, 1u);
  EXPECT_EQ(stats.puts, first_puts + 1);
}

TEST(UcxTransferEngineTest, BatchesOverlapInFlight) {
  constexpr size_t kBytes = 16 * kMiB;
  constexpr int kLayers = 32;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const uint64_t seed = 23;
  const std::vector<uint8_t> image = Image(seed, kBytes);

  // One batch per "layer", each flushed before the next is built; none waited for.
  std::vector<Range> all;
  std::atomic<int> remaining{kLayers};
  std::atomic<int> failures{0};
  internal::Event done;
  const size_t per_layer = kBytes / kLayers;
  for (int layer = 0; layer < kLayers; ++layer) {
    auto batch = engine->NewBatch(peer->descriptor());
    std::vector<Range> ranges;
    for (uint64_t off = layer * per_layer; off + kKvPiece <= (layer + 1) * per_layer;
         off += kKvPiece) {
      ranges.push_back(Range{off, kKvPiece});
    }
    ASSERT_TRUE(PutRanges(*batch, image, ranges).ok());
    all.insert(all.end(), ranges.begin(), ranges.end());
    batch->Flush(absl::Seconds(120), [&](absl::Status s) {
      if (!s.ok()) failures.fetch_add(1);
      if (remaining.fetch_sub(1) == 1) done.Notify();
    });
  }
  ASSERT_TRUE(done.WaitFor(absl::Seconds(180)));
  EXPECT_EQ(failures.load(), 0);
  auto verdict = peer->Verify(seed, all);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");
}

TEST(UcxTransferEngineTest, OutOfRangePutIsRejectedAndNothingIsWritten) {
  constexpr size_t kBytes = kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const uint64_t seed = 3;
  const std::vector<uint8_t> image = Image(seed, 2 * kBytes);

  auto batch = engine->NewBatch(peer->descriptor());
  EXPECT_EQ(batch->Put(image.data(), 11, kBytes - 10).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(image.data(), 1, kBytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(image.data(), 2 * kBytes, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(image.data(), 8, std::numeric_limits<uint64_t>::max() - 4).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(batch->Put(image.data() + 100, 4000, 100).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)).ok());

  // A slice bounds puts to the slice, at the slice's place in the region.
  auto slice = peer->descriptor().Slice(8192, 4096);
  ASSERT_TRUE(slice.ok());
  batch = engine->NewBatch(*slice);
  EXPECT_EQ(batch->Put(image.data() + 8192, 4097, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(batch->Put(image.data() + 8192, 4096, 0).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(30)).ok());

  auto verdict = peer->Verify(seed, {Range{100, 4000}, Range{8192, 4096}});
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "") << "something outside the accepted puts was written";
}

TEST(UcxTransferEngineTest, NoPutStartsAfterTheWriteDeadline) {
  // A KV lease's writer (services/prefill/kv_write_deadline.h): the progress thread checks
  // the batch's write deadline right before each put or shared-memory copy, so a batch
  // that reaches it late writes nothing.
  constexpr size_t kBytes = kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const uint64_t seed = 5;
  const std::vector<uint8_t> image = Image(seed, kBytes);
  auto late = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(late->Put(image.data(), 4096, 0).ok());
  ASSERT_TRUE(late->Put(image.data() + 65536, 4096, 65536).ok());
  late->set_write_deadline(std::chrono::steady_clock::now());
  EXPECT_EQ(late->Wait(absl::Seconds(30)).code(), absl::StatusCode::kDeadlineExceeded) << Tls();
  auto in_time = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(in_time->Put(image.data() + 8192, 4096, 8192).ok());
  in_time->set_write_deadline(std::chrono::steady_clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(in_time->Wait(absl::Seconds(30)).ok()) << Tls();
  auto verdict = peer->Verify(seed, {Range{8192, 4096}});
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "") << "a put after the write deadline landed (" << Tls() << ")";
}

TEST(UcxTransferEngineTest, ForeignOrGarbageDescriptorsAreCleanErrors) {
  auto engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(RemoteMemoryDescriptor::Parse("garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  RemoteMemoryDescriptor inproc;
  inproc.transport = "inproc";
  inproc.engine_address = "inproc:1";
  inproc.length = 100;
  auto batch = engine->NewBatch(inproc);
  char byte = 1;
  ASSERT_TRUE(batch->Put(&byte, 1, 0).ok());
  EXPECT_EQ(batch->Wait(absl::Seconds(10)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->stats().batches_failed, 1u);
}

// Peer died before anything was sent: the batch fails (no hang), and the engine still
// works with a new peer afterwards.
TEST(UcxTransferEngineTest, PeerKilledBeforePutsFailsPromptly) {
  constexpr size_t kBytes = 4 * kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const RemoteMemoryDescriptor dead = peer->descriptor();
  peer->Signal(SIGKILL);
  const std::vector<uint8_t> image = Image(1, kBytes);

  for (int attempt = 0; attempt < 2; ++attempt) {
    auto batch = engine->NewBatch(dead);
    ASSERT_TRUE(PutRanges(*batch, image, {Range{0, kBytes}}).ok());
    const absl::Time start = absl::Now();
    absl::Status status = batch->Wait(absl::Seconds(20));
    const absl::Duration took = absl::Now() - start;
    std::printf("UCX_TLS=%s: put to a dead peer -> %s after %s\n", Tls().c_str(),
                status.ToString().c_str(), absl::FormatDuration(took).c_str());
    EXPECT_FALSE(status.ok());
    EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
                status.code() == absl::StatusCode::kDeadlineExceeded)
        << status;
    EXPECT_LT(took, absl::Seconds(30));
  }

  auto fresh = NewPeer(kBytes);
  ASSERT_NE(fresh, nullptr);
  const std::vector<uint8_t> fresh_image = Image(2, kBytes);  // valid until done ran
  auto batch = engine->NewBatch(fresh->descriptor());
  ASSERT_TRUE(PutRanges(*batch, fresh_image, {Range{0, kBytes}}).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(60)).ok());
  auto verdict = fresh->Verify(2, {Range{0, kBytes}});
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");
}

// Peer killed while batches stream into it (one 64 MiB batch after the other, as layers
// would): the batches after the kill fail, each within a bounded time, none hangs.
TEST(UcxTransferEngineTest, PeerKilledDuringPutsFailsPromptly) {
  constexpr size_t kBytes = 64 * kMiB;
  constexpr int kMaxBatches = 400;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const std::vector<uint8_t> image = Image(4, kBytes);
  std::vector<Range> blocks;
  for (uint64_t off = 0; off + kKvPiece <= kBytes; off += kKvPiece) {
    blocks.push_back(Range{off, kKvPiece});
  }

  internal::Event first_ok;
  std::thread killer([&] {
    first_ok.Wait();
    absl::SleepFor(absl::Milliseconds(20));  // in the middle of a later batch
    peer->Signal(SIGKILL);
  });
  int ok = 0;
  absl::Status failure;
  absl::Duration slowest;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kMaxBatches && failure.ok(); ++i) {
    auto batch = engine->NewBatch(peer->descriptor());
    ASSERT_TRUE(PutRanges(*batch, image, blocks).ok());
    const absl::Time t0 = absl::Now();
    absl::Status status = batch->Wait(absl::Seconds(20));
    slowest = std::max(slowest, absl::Now() - t0);
    if (status.ok()) {
      ++ok;
      if (!first_ok.HasBeenNotified()) first_ok.Notify();
    } else {
      failure = status;
    }
  }
  if (!first_ok.HasBeenNotified()) first_ok.Notify();
  killer.join();
  std::printf("UCX_TLS=%s: %d batches of 64 MiB OK, then %s; slowest batch %s, %s in all\n",
              Tls().c_str(), ok, failure.ToString().c_str(),
              absl::FormatDuration(slowest).c_str(),
              absl::FormatDuration(absl::Now() - start).c_str());
  EXPECT_GE(ok, 1);
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_LT(slowest, absl::Seconds(25));
  EXPECT_EQ(engine->stats().batches_failed, 1u);
}

// A stopped (not dead) peer: a batch that cannot complete times out with
// DEADLINE_EXCEEDED (tcp needs the peer's progress; cma does not, so it may succeed), the
// endpoint is dropped, and once the peer runs again the next batch reconnects to it.
TEST(UcxTransferEngineTest, StuckPeerTimesOutAndTheNextBatchReconnects) {
  constexpr size_t kBytes = 64 * kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const std::vector<uint8_t> image = Image(8, kBytes);
  const std::vector<Range> whole = {Range{0, kBytes}};

  auto warmup = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*warmup, image, {Range{0, 4096}}).ok());
  ASSERT_TRUE(warmup->Wait(absl::Seconds(30)).ok());

  peer->Signal(SIGSTOP);
  auto batch = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*batch, image, whole).ok());
  const absl::Time start = absl::Now();
  absl::Status status = batch->Wait(absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  std::printf("UCX_TLS=%s: 64 MiB to a stopped peer -> %s after %s\n", Tls().c_str(),
              status.ToString().c_str(), absl::FormatDuration(took).c_str());
  EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(took, absl::Seconds(10));
  const uint64_t failures_before = engine->stats().endpoint_failures;
  if (!status.ok()) {
    EXPECT_EQ(failures_before, 1u);
  }

  peer->Signal(SIGCONT);
  batch = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*batch, image, whole).ok());
  status = batch->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status;
  auto verdict = peer->Verify(8, whole);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(*verdict, "");
  EXPECT_EQ(engine->stats().endpoints_created, status.ok() && failures_before == 0 ? 1u : 2u);
}

// Many batches from 2 threads of one engine to 2 peers at once, each thread writing its
// own half of each peer's buffer, with up to 8 batches per thread in flight.
TEST(UcxTransferEngineTest, ConcurrentBatchesFromTwoThreadsToTwoPeers) {
  constexpr size_t kBytes = 16 * kMiB;
  constexpr int kBatchesPerThread = 200;
  constexpr int kPutsPerBatch = 6;
  auto engine = NewEngine();
  std::vector<std::unique_ptr<PeerProcess>> peers;
  peers.push_back(NewPeer(kBytes));
  peers.push_back(NewPeer(kBytes));
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peers[0], nullptr);
  ASSERT_NE(peers[1], nullptr);
  const uint64_t seed = 99;
  const std::vector<uint8_t> image = Image(seed, kBytes);
  std::vector<Range> written[2][2];  // [thread][peer]

  auto run = [&](int t) {
    std::atomic<int> in_flight{0};
    std::atomic<int> failures{0};
    const uint64_t half = kBytes / 2;
    uint64_t cursor[2] = {t * half, t * half};
    for (int i = 0; i < kBatchesPerThread; ++i) {
      const int p = i % 2;
      auto batch = engine->NewBatch(peers[p]->descriptor());
      for (int k = 0; k < kPutsPerBatch; ++k) {
        const uint64_t length = 1000 + (i * 7919 + k * 104729) % 20000;
        if (cursor[p] + length > (t + 1) * half) cursor[p] = t * half;
        EXPECT_TRUE(batch->Put(image.data() + cursor[p], length, cursor[p]).ok());
        written[t][p].push_back(Range{cursor[p], length});
        cursor[p] += length + 64;
      }
      while (in_flight.load() >= 8) std::this_thread::yield();
      in_flight.fetch_add(1);
      if (i % 3 == 0) {
        in_flight.fetch_sub(1);
        EXPECT_TRUE(batch->Wait(absl::Seconds(60)).ok());
      } else {
        batch->Flush(absl::Seconds(60), [&](absl::Status s) {
          if (!s.ok()) failures.fetch_add(1);
          in_flight.fetch_sub(1);
        });
      }
    }
    while (in_flight.load() > 0) std::this_thread::yield();
    EXPECT_EQ(failures.load(), 0);
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();

  for (int p = 0; p < 2; ++p) {
    std::vector<Range> ranges = written[0][p];
    ranges.insert(ranges.end(), written[1][p].begin(), written[1][p].end());
    auto verdict = peers[p]->Verify(seed, ranges);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(*verdict, "") << "peer " << p;
  }
  const TransferStats stats = engine->stats();
  EXPECT_EQ(stats.batches_ok, 2u * kBatchesPerThread);
  EXPECT_EQ(stats.puts, 2u * kBatchesPerThread * kPutsPerBatch);
  EXPECT_EQ(stats.endpoints_created, 2u);
}

// Destroying the engine with a batch in flight to a stopped peer completes it (CANCELLED,
// or OK where the transport needs no help from the peer) instead of hanging.
TEST(UcxTransferEngineTest, DestroyingTheEngineCompletesBatchesInFlight) {
  constexpr size_t kBytes = 64 * kMiB;
  auto engine = NewEngine();
  auto peer = NewPeer(kBytes);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(peer, nullptr);
  const std::vector<uint8_t> image = Image(1, kBytes);
  peer->Signal(SIGSTOP);
  internal::Event done;
  absl::Status result;
  auto batch = engine->NewBatch(peer->descriptor());
  ASSERT_TRUE(PutRanges(*batch, image, {Range{0, kBytes}}).ok());
  batch->Flush(absl::InfiniteDuration(), [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  absl::SleepFor(absl::Milliseconds(200));
  batch.reset();
  engine.reset();
  ASSERT_TRUE(done.HasBeenNotified());
  EXPECT_TRUE(result.ok() || result.code() == absl::StatusCode::kCancelled) << result;
  peer->Signal(SIGCONT);
}

}  // namespace
}  // namespace tandem::transfer
