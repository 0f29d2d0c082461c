// The prefill side of the device-to-device path for layouts other than one latent stream
// (DeviceKvSink::OnSequenceKv, DeepSeek-V4): the writer gets this pool's ranges of the
// sequence and the same list laid out by the destination's geometry, blocks and state
// slot; nothing is written before the decode replica accepted the writer, after the
// write deadline, or past the reservation; a writer's failure reaches Flush. A
// hand-written writer stands in for the GPU one (cuda_v4_peer_kv.h), which the GPU
// serving test runs between two processes.
#include <chrono>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/prefill/device_kv_sink.h"

namespace tandem {
namespace {

class FakeRangesWriter : public PeerKvWriter {
 public:
  struct Call {
    std::vector<KvExtent> src, dst;
  };
  explicit FakeRangesWriter(std::vector<Call>* calls, absl::Status result = absl::OkStatus())
      : calls_(calls), result_(std::move(result)) {}
  absl::Status WriteLayer(int64_t, std::span<const int32_t>, int64_t, int64_t) override {
    ADD_FAILURE() << "a ranges writer got a layer";
    return absl::OkStatus();
  }
  bool writes_ranges() const override { return true; }
  absl::Status WriteRanges(std::span<const KvExtent> src, std::span<const KvExtent> dst) override {
    calls_->push_back({{src.begin(), src.end()}, {dst.begin(), dst.end()}});
    for (const KvExtent& e : src) bytes_ += static_cast<int64_t>(e.bytes);
    return result_;
  }
  int64_t bytes() const override { return bytes_; }
  uint64_t checksum() const override { return 42; }
  std::string path() const override { return "fake"; }

 private:
  std::vector<Call>* calls_;
  absl::Status result_;
  int64_t bytes_ = 0;
};

// A window-ring, a per-window and a per-sequence-state stream over two layers.
std::vector<KvStream> Streams() {
  return {{.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing, .tokens = 16, .width = 8,
           .layers = {0, 1}},
          {.name = "entries", .dtype = "f32", .granularity = KvGranularity::kPerWindow, .tokens = 4, .width = 8,
           .layers = {1}},
          {.name = "state", .dtype = "f32", .granularity = KvGranularity::kSequenceState, .tokens = 6, .width = 8,
           .layers = {1}}};
}

v1::KvDestination Destination() {
  v1::KvDestination d;
  d.set_num_layers(2);
  d.set_block_size(64);
  d.set_num_blocks(16);  // another pool than the source's
  d.set_num_state_slots(6);
  d.set_state_slot(3);
  d.add_block_ids(5);
  d.add_block_ids(9);
  return d;
}

class DeviceKvSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = KvPool::Create(Streams(), {.num_layers = 2, .block_size = 64, .num_blocks = 8, .num_sequence_slots = 4});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  KvSequenceKv Sequence(int64_t num_tokens) {
    return {.request_id = &id_, .pool = pool_.get(), .block_table = blocks_, .state_slot = 1, .num_tokens = num_tokens};
  }

  static absl::Status Flushed(DeviceKvSink& sink) {
    absl::Status got = absl::UnknownError("Flush never called back");
    sink.Flush([&](absl::Status s) { got = std::move(s); });
    return got;
  }

  std::unique_ptr<KvPool> pool_;
  std::string id_ = "r";
  std::vector<int32_t> blocks_ = {2, 6};
  std::chrono::steady_clock::time_point later_ = std::chrono::steady_clock::now() + std::chrono::minutes(1);
};

std::shared_ptr<WriteGate> Gate(absl::Status s) {
  auto gate = std::make_shared<WriteGate>();
  gate->Resolve(std::move(s));
  return gate;
}

TEST_F(DeviceKvSinkTest, CopiesTheSequencesRangesToTheDestinationsLayout) {
  std::vector<FakeRangesWriter::Call> calls;
  DeviceKvSink sink(std::make_unique<FakeRangesWriter>(&calls), Destination(), later_, Gate(absl::OkStatus()));
  EXPECT_TRUE(sink.takes_sequence_kv());
  EXPECT_FALSE(sink.wants_host_kv());
  sink.OnSequenceKv(Sequence(100));
  ASSERT_EQ(calls.size(), 1u);
  auto want_src = pool_->SequenceExtents(blocks_, 1, 100);
  const KvPool::Geometry dest{.num_layers = 2, .block_size = 64, .num_blocks = 16, .num_sequence_slots = 6};
  auto want_dst = KvPool::SequenceExtents(Streams(), dest, std::vector<int32_t>{5, 9}, 3, 100);
  ASSERT_TRUE(want_src.ok() && want_dst.ok());
  ASSERT_EQ(calls[0].src.size(), want_src->size());
  ASSERT_EQ(calls[0].dst.size(), want_dst->size());
  bool moved = false;
  for (size_t i = 0; i < want_src->size(); ++i) {
    EXPECT_EQ(calls[0].src[i].offset, (*want_src)[i].offset) << i;
    EXPECT_EQ(calls[0].dst[i].offset, (*want_dst)[i].offset) << i;
    EXPECT_EQ(calls[0].src[i].bytes, calls[0].dst[i].bytes) << i;
    EXPECT_EQ(calls[0].src[i].layer, calls[0].dst[i].layer) << i;
    moved |= calls[0].src[i].offset != calls[0].dst[i].offset;
  }
  EXPECT_TRUE(moved) << "the destination's blocks and slot are not the source's";
  EXPECT_TRUE(Flushed(sink).ok());
  EXPECT_GT(sink.bytes(), 0);
  EXPECT_EQ(sink.checksum(), 42u);
  EXPECT_EQ(sink.path(), v1::KV_PATH_CUDA_IPC);
}

TEST_F(DeviceKvSinkTest, NothingIsWrittenUnlessTheDecodeReplicaAcceptedTheWriter) {
  std::vector<FakeRangesWriter::Call> calls;
  DeviceKvSink sink(std::make_unique<FakeRangesWriter>(&calls), Destination(), later_,
                    Gate(absl::AbortedError("the decode replica refused this writer")));
  sink.OnSequenceKv(Sequence(100));
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(Flushed(sink).code(), absl::StatusCode::kAborted);
}

TEST_F(DeviceKvSinkTest, NothingIsWrittenAfterTheWriteDeadline) {
  std::vector<FakeRangesWriter::Call> calls;
  DeviceKvSink sink(std::make_unique<FakeRangesWriter>(&calls), Destination(),
                    std::chrono::steady_clock::now() - std::chrono::milliseconds(1), Gate(absl::OkStatus()));
  sink.OnSequenceKv(Sequence(100));
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(Flushed(sink).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(DeviceKvSinkTest, ASequenceLongerThanTheReservationIsNotWritten) {
  std::vector<FakeRangesWriter::Call> calls;
  DeviceKvSink sink(std::make_unique<FakeRangesWriter>(&calls), Destination(), later_, Gate(absl::OkStatus()));
  blocks_ = {2, 6, 7};  // three blocks here, two reserved there
  sink.OnSequenceKv(Sequence(129));
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(Flushed(sink).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DeviceKvSinkTest, TheWritersFailureReachesFlush) {
  std::vector<FakeRangesWriter::Call> calls;
  DeviceKvSink sink(std::make_unique<FakeRangesWriter>(&calls, absl::InternalError("the GPU copy failed")),
                    Destination(), later_, Gate(absl::OkStatus()));
  sink.OnSequenceKv(Sequence(100));
  EXPECT_EQ(calls.size(), 1u);
  const absl::Status st = Flushed(sink);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("GPU copy failed"), std::string::npos);
}

}  // namespace
}  // namespace tandem
