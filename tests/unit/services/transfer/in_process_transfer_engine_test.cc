#include "services/common/transfer/in_process_transfer_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/transfer/event.h"
#include "services/common/transfer/checksum.h"

namespace tandem::transfer {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
  return v;
}

TEST(InProcessTransferEngineTest, PutsLandAndFlushCompletes) {
  InProcessTransferEngine sender;
  InProcessTransferEngine receiver;
  std::vector<uint8_t> dest(1 << 20, 0);
  auto region = receiver.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok()) << region.status();
  const RemoteMemoryDescriptor& d = (*region)->descriptor();
  EXPECT_EQ(d.transport, "inproc");
  EXPECT_EQ(d.engine_address, receiver.address());
  EXPECT_EQ(d.length, dest.size());

  const std::vector<uint8_t> a = Bytes(4096, 1), b = Bytes(100, 2), c = Bytes(147456, 3);
  auto batch = sender.NewBatch(*RemoteMemoryDescriptor::Parse(d.Serialize()));
  ASSERT_TRUE(batch->Put(a.data(), a.size(), 0).ok());
  ASSERT_TRUE(batch->Put(b.data(), b.size(), 5000).ok());
  ASSERT_TRUE(batch->Put(c.data(), c.size(), dest.size() - c.size()).ok());
  ASSERT_TRUE(batch->Put(a.data(), 0, dest.size()).ok()) << "zero-length put at the end";
  EXPECT_EQ(batch->num_puts(), 3u);
  EXPECT_EQ(batch->bytes(), a.size() + b.size() + c.size());
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)).ok());

  EXPECT_EQ(std::memcmp(dest.data(), a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(dest.data() + 5000, b.data(), b.size()), 0);
  EXPECT_EQ(std::memcmp(dest.data() + dest.size() - c.size(), c.data(), c.size()), 0);
  EXPECT_EQ(dest[4096], 0);
  EXPECT_EQ(dest[4999], 0);
  EXPECT_EQ(dest[5100], 0);
  EXPECT_EQ(Checksum(dest.data() + 5000, b.size(), 9), Checksum(b.data(), b.size(), 9));

  const TransferStats stats = sender.stats();
  EXPECT_EQ(stats.bytes_put, a.size() + b.size() + c.size());
  EXPECT_EQ(stats.puts, 3u);
  EXPECT_EQ(stats.batches_ok, 1u);
  EXPECT_EQ(stats.batches_failed, 0u);
}

TEST(InProcessTransferEngineTest, NoPutStartsAfterTheWriteDeadline) {
  // A KV lease's writer (services/prefill/kv_write_deadline.h): a batch that reaches the
  // transport after its write deadline writes nothing and fails with DEADLINE_EXCEEDED.
  InProcessTransferEngine sender;
  InProcessTransferEngine receiver;
  std::vector<uint8_t> dest(1 << 16, 0);
  auto region = receiver.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok()) << region.status();
  const std::vector<uint8_t> a = Bytes(4096, 1);
  auto late = sender.NewBatch((*region)->descriptor());
  ASSERT_TRUE(late->Put(a.data(), a.size(), 0).ok());
  late->set_write_deadline(std::chrono::steady_clock::now());
  EXPECT_EQ(late->Wait(absl::Seconds(10)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(std::all_of(dest.begin(), dest.end(), [](uint8_t x) { return x == 0; })) << "a late put landed";
  auto in_time = sender.NewBatch((*region)->descriptor());
  ASSERT_TRUE(in_time->Put(a.data(), a.size(), 8192).ok());
  in_time->set_write_deadline(std::chrono::steady_clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(in_time->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp(dest.data() + 8192, a.data(), a.size()), 0);
  EXPECT_EQ(sender.stats().batches_failed, 1u);
}

TEST(InProcessTransferEngineTest, BoundsAreCheckedAndNothingIsWritten) {
  InProcessTransferEngine engine;
  std::vector<uint8_t> dest(8192, 0);
  auto region = engine.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok());
  const std::vector<uint8_t> src = Bytes(8192, 5);
  auto batch = engine.NewBatch((*region)->descriptor());
  EXPECT_EQ(batch->Put(src.data(), 1, 8192).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(src.data(), 2, 8191).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(src.data(), 8193, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(src.data(), 16, std::numeric_limits<uint64_t>::max() - 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->Put(nullptr, 16, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch->num_puts(), 0u);
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)).ok()) << "an empty batch completes";
  EXPECT_EQ(std::count(dest.begin(), dest.end(), 0), 8192);

  // A slice of the region bounds puts to the slice.
  auto slice = (*region)->descriptor().Slice(4096, 1024);
  ASSERT_TRUE(slice.ok());
  batch = engine.NewBatch(*slice);
  EXPECT_EQ(batch->Put(src.data(), 1025, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(batch->Put(src.data(), 1024, 0).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp(dest.data() + 4096, src.data(), 1024), 0);
  EXPECT_EQ(std::count(dest.begin(), dest.begin() + 4096, 0), 4096);
  EXPECT_EQ(std::count(dest.begin() + 5120, dest.end(), 0), 3072);
}

TEST(InProcessTransferEngineTest, ContiguousPutsAreMerged) {
  InProcessTransferEngine engine;
  std::vector<uint8_t> dest(4096, 0);
  auto region = engine.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok());
  const std::vector<uint8_t> src = Bytes(4096, 8);
  auto batch = engine.NewBatch((*region)->descriptor());
  ASSERT_TRUE(batch->Put(src.data(), 100, 0).ok());
  ASSERT_TRUE(batch->Put(src.data() + 100, 200, 100).ok());   // continues both: merged
  ASSERT_TRUE(batch->Put(src.data() + 300, 100, 1000).ok());  // remote gap: new put
  ASSERT_TRUE(batch->Put(src.data() + 500, 100, 1100).ok());  // local gap: new put
  ASSERT_TRUE(batch->Put(src.data() + 600, 0, 1200).ok());    // empty: nothing
  EXPECT_EQ(batch->num_puts(), 3u);
  EXPECT_EQ(batch->bytes(), 500u);
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp(dest.data(), src.data(), 300), 0);
  EXPECT_EQ(std::memcmp(dest.data() + 1000, src.data() + 300, 100), 0);
  EXPECT_EQ(std::memcmp(dest.data() + 1100, src.data() + 500, 100), 0);
  EXPECT_EQ(engine.stats().puts, 3u);
}

TEST(InProcessTransferEngineTest, FlushTwiceAndPutAfterFlushFail) {
  InProcessTransferEngine engine;
  std::vector<uint8_t> dest(64, 0);
  auto region = engine.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok());
  auto batch = engine.NewBatch((*region)->descriptor());
  ASSERT_TRUE(batch->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(batch->Put(dest.data(), 1, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(batch->Wait(absl::Seconds(5)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.stats().batches_failed, 1u);
}

TEST(InProcessTransferEngineTest, RegisterRejectsEmptyRanges) {
  InProcessTransferEngine engine;
  char c;
  EXPECT_EQ(engine.RegisterMemory(nullptr, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.RegisterMemory(&c, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessTransferEngineTest, AllocatedMemoryIsZeroedAndWritable) {
  InProcessTransferEngine sender;
  InProcessTransferEngine receiver;
  auto region = receiver.AllocateMemory(10000);
  ASSERT_TRUE(region.ok()) << region.status();
  const auto* p = static_cast<const uint8_t*>((*region)->base());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(std::count(p, p + 10000, 0), 10000);
  const std::vector<uint8_t> src = Bytes(10000, 4);
  auto batch = sender.NewBatch((*region)->descriptor());
  ASSERT_TRUE(batch->Put(src.data(), src.size(), 0).ok());
  ASSERT_TRUE(batch->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp(p, src.data(), src.size()), 0);
  EXPECT_EQ(receiver.AllocateMemory(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessTransferEngineTest, FailuresAreReported) {
  auto sender = std::make_unique<InProcessTransferEngine>();
  auto receiver = std::make_unique<InProcessTransferEngine>();
  std::vector<uint8_t> dest(1024, 0);
  const std::vector<uint8_t> src = Bytes(1024, 9);
  auto region = receiver->RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok());
  const RemoteMemoryDescriptor d = (*region)->descriptor();

  // Another transport's descriptor.
  RemoteMemoryDescriptor ucx = d;
  ucx.transport = "ucx";
  auto batch = sender->NewBatch(ucx);
  ASSERT_TRUE(batch->Put(src.data(), 10, 0).ok());
  EXPECT_EQ(batch->Wait(absl::Seconds(5)).code(), absl::StatusCode::kInvalidArgument);

  // Injected failure: nothing written.
  sender->InjectFailure(absl::AbortedError("injected"));
  batch = sender->NewBatch(d);
  ASSERT_TRUE(batch->Put(src.data(), 10, 0).ok());
  EXPECT_EQ(batch->Wait(absl::Seconds(5)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(dest[0], 0);
  sender->InjectFailure(absl::OkStatus());

  // Deadline already passed.
  batch = sender->NewBatch(d);
  ASSERT_TRUE(batch->Put(src.data(), 10, 0).ok());
  EXPECT_EQ(batch->Wait(absl::ZeroDuration() - absl::Seconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);

  // Deregistered region, then a peer engine that is gone.
  region->reset();
  batch = sender->NewBatch(d);
  ASSERT_TRUE(batch->Put(src.data(), 10, 0).ok());
  EXPECT_EQ(batch->Wait(absl::Seconds(5)).code(), absl::StatusCode::kFailedPrecondition);
  receiver.reset();
  batch = sender->NewBatch(d);
  ASSERT_TRUE(batch->Put(src.data(), 10, 0).ok());
  EXPECT_EQ(batch->Wait(absl::Seconds(5)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(std::count(dest.begin(), dest.end(), 0), 1024);
  EXPECT_EQ(sender->stats().batches_failed, 5u);
  EXPECT_EQ(sender->stats().batches_ok, 0u);
}

TEST(InProcessTransferEngineTest, AsyncBatchesCompleteOnTheCompletionThread) {
  InProcessTransferEngine sender;
  InProcessTransferEngine receiver;
  constexpr int kBatches = 64;
  constexpr size_t kPiece = 4096;
  std::vector<uint8_t> dest(kBatches * kPiece, 0);
  const std::vector<uint8_t> src = Bytes(dest.size(), 11);
  auto region = receiver.RegisterMemory(dest.data(), dest.size());
  ASSERT_TRUE(region.ok());

  std::atomic<int> remaining{kBatches};
  std::atomic<int> on_caller_thread{0};
  internal::Event all_done;
  const auto caller = std::this_thread::get_id();
  std::vector<std::unique_ptr<TransferBatch>> batches;
  for (int i = 0; i < kBatches; ++i) {
    batches.push_back(sender.NewBatch((*region)->descriptor()));
    ASSERT_TRUE(batches.back()->Put(src.data() + i * kPiece, kPiece, i * kPiece).ok());
    batches.back()->Flush(absl::Seconds(10), [&](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      if (std::this_thread::get_id() == caller) on_caller_thread.fetch_add(1);
      if (remaining.fetch_sub(1) == 1) all_done.Notify();
    });
    if (i % 2 == 0) batches.back().reset();  // a flushed batch runs on without its handle
  }
  ASSERT_TRUE(all_done.WaitFor(absl::Seconds(30)));
  EXPECT_EQ(on_caller_thread.load(), 0);
  EXPECT_EQ(dest, src);
  EXPECT_EQ(sender.stats().batches_ok, static_cast<uint64_t>(kBatches));
}

}  // namespace
}  // namespace tandem::transfer
