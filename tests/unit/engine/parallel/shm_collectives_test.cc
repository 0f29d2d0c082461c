// The shared-memory collectives' results on 2, 4 and 8 forked ranks: rank-order sums bit
// for bit, contents of gathers, exchanges and broadcasts at sizes 0, 1, odd and larger
// than a slot, and a long random sequence of mixed operations.
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "engine/parallel/shm_collectives.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/parallel/group_test_util.h"

namespace tandem::parallel {
namespace {

using testing::ExpectAllOk;
using testing::Input;
using testing::LeftoverSegments;
using testing::Pattern;
using testing::RankOrderSum;
using testing::RunGroup;
using testing::UniqueName;

class ShmCollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
  void TearDown() override { EXPECT_TRUE(LeftoverSegments().empty()); }
};

// Element counts: none, one, odd, several slots (4096-byte slots hold 1024 floats) in the
// one-round form, and above 16 KiB, where more than two ranks reduce-scatter then gather.
constexpr size_t kReduceSizes[] = {0, 1, 7, 1000, 3001, 10007};

TEST_P(ShmCollectivesTest, AllReduceSumIsTheRankOrderSumBitForBit) {
  // The inputs are worth testing with: another order of addition changes many sums (from
  // three ranks: with two, a + b is b + a, and any order is right), and starting from
  // +0.0f changes the -0.0f ones.
  const std::vector<float> forward = RankOrderSum(world(), 10007);
  size_t differ = 0;
  size_t differ_from_zero = 0;
  for (size_t i = 0; i < forward.size(); ++i) {
    float reverse = Input(world() - 1, i);
    for (int r = world() - 2; r >= 0; --r) reverse += Input(r, i);
    differ += std::memcmp(&reverse, &forward[i], sizeof(float)) != 0;
    float from_zero = 0.0f;
    for (int r = 0; r < world(); ++r) from_zero += Input(r, i);
    differ_from_zero += std::memcmp(&from_zero, &forward[i], sizeof(float)) != 0;
  }
  if (world() > 2) {
    EXPECT_GT(differ, forward.size() / 20);
  }
  EXPECT_GT(differ_from_zero, forward.size() / 100);

  ExpectAllOk(RunGroup(world(), UniqueName("reduce"), [](ShmCollectives& g) {
    for (size_t n : kReduceSizes) {
      for (uint64_t salt = 0; salt < 2; ++salt) {
        std::vector<float> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = Input(g.rank(), i, salt);
        absl::Status s = g.AllReduceSum(data);
        RANK_EXPECT(g.rank(), s.ok(), s.ToString());
        const std::vector<float> want = RankOrderSum(g.world_size(), n, salt);
        RANK_EXPECT(g.rank(), n == 0 || std::memcmp(data.data(), want.data(), n * 4) == 0,
                    "n = ", n);
      }
    }
    return 0;
  }));
}

constexpr size_t kByteSizes[] = {0, 1, 13, 4096, 9001};

TEST_P(ShmCollectivesTest, AllGatherPlacesEveryBlockInRankOrder) {
  ExpectAllOk(RunGroup(world(), UniqueName("gather"), [](ShmCollectives& g) {
    const int w = g.world_size();
    for (size_t b : kByteSizes) {
      for (bool in_place : {false, true}) {
        std::vector<std::byte> send(b);
        for (size_t i = 0; i < b; ++i) send[i] = Pattern(g.rank(), 1, i);
        std::vector<std::byte> recv(b * w, std::byte{0xEE});
        std::span<const std::byte> from = send;
        if (in_place) {
          std::copy(send.begin(), send.end(), recv.begin() + g.rank() * b);
          from = std::span<const std::byte>(recv).subspan(g.rank() * b, b);
        }
        absl::Status s = g.AllGather(from, recv);
        RANK_EXPECT(g.rank(), s.ok(), s.ToString());
        for (int r = 0; r < w; ++r) {
          for (size_t i = 0; i < b; ++i) {
            RANK_EXPECT(g.rank(), recv[r * b + i] == Pattern(r, 1, i), "b ", b, " block ", r, " byte ", i);
          }
        }
      }
    }
    return 0;
  }));
}

TEST_P(ShmCollectivesTest, BroadcastCopiesTheRootsBytesFromEveryRoot) {
  ExpectAllOk(RunGroup(world(), UniqueName("bcast"), [](ShmCollectives& g) {
    for (int root = 0; root < g.world_size(); ++root) {
      for (size_t n : kByteSizes) {
        std::vector<std::byte> data(n, std::byte{0xEE});
        if (g.rank() == root) {
          for (size_t i = 0; i < n; ++i) data[i] = Pattern(root, 2, i);
        }
        absl::Status s = g.Broadcast(data, root);
        RANK_EXPECT(g.rank(), s.ok(), s.ToString());
        for (size_t i = 0; i < n; ++i) {
          RANK_EXPECT(g.rank(), data[i] == Pattern(root, 2, i), "root ", root, " n ", n, " i ", i);
        }
      }
    }
    return 0;
  }));
}

// Bytes from s to d: none, one, odd, about a slot, several slots, uneven across pairs.
size_t ExchangeSize(int s, int d, int salt) {
  static constexpr size_t kSizes[] = {0, 1, 13, 4095, 9001, 0, 7, 100};
  return kSizes[(s * 5 + d * 3 + salt) % 8];
}

// Runs one all-to-all with ExchangeSize and checks what this rank received.
int ExchangeAndCheck(ShmCollectives& g, int salt, size_t spare) {
  const int w = g.world_size();
  std::vector<std::vector<std::byte>> blocks(w);
  std::vector<std::span<const std::byte>> send(w);
  size_t incoming = 0;
  for (int d = 0; d < w; ++d) {
    blocks[d].resize(ExchangeSize(g.rank(), d, salt));
    for (size_t i = 0; i < blocks[d].size(); ++i) blocks[d][i] = Pattern(g.rank(), d + salt, i);
    send[d] = blocks[d];
    incoming += ExchangeSize(d, g.rank(), salt);
  }
  std::vector<std::byte> recv(incoming + spare, std::byte{0xEE});
  std::vector<size_t> sizes(w, 12345);
  absl::Status s = g.AllToAll(send, recv, sizes);
  RANK_EXPECT(g.rank(), s.ok(), s.ToString());
  size_t at = 0;
  for (int src = 0; src < w; ++src) {
    RANK_EXPECT(g.rank(), sizes[src] == ExchangeSize(src, g.rank(), salt), "from ", src);
    for (size_t i = 0; i < sizes[src]; ++i) {
      RANK_EXPECT(g.rank(), recv[at + i] == Pattern(src, g.rank() + salt, i), "from ", src, " i ", i);
    }
    at += sizes[src];
  }
  for (size_t i = at; i < recv.size(); ++i) RANK_EXPECT(g.rank(), recv[i] == std::byte{0xEE});
  return 0;
}

TEST_P(ShmCollectivesTest, AllToAllDeliversUnevenBlocksPackedBySource) {
  ExpectAllOk(RunGroup(world(), UniqueName("a2a"), [](ShmCollectives& g) {
    for (int salt = 0; salt < 8; ++salt) {
      if (int rc = ExchangeAndCheck(g, salt, salt % 2 == 0 ? 0 : 1000); rc != 0) return rc;
    }
    return 0;
  }));
}

TEST_P(ShmCollectivesTest, AllToAllTooSmallIsOneVerdictOnEveryRankAndTheGroupGoesOn) {
  ExpectAllOk(RunGroup(world(), UniqueName("a2a-small"), [](ShmCollectives& g) {
    const int w = g.world_size();
    std::vector<std::byte> block(100, std::byte{1});
    std::vector<std::span<const std::byte>> send(w, block);
    // The last rank's buffer is one byte short; nobody else's is.
    std::vector<std::byte> recv(100 * w - (g.rank() == w - 1 ? 1 : 0));
    std::vector<size_t> sizes(w, 0);
    absl::Status s = g.AllToAll(send, recv, sizes);
    RANK_EXPECT(g.rank(), absl::IsResourceExhausted(s), s.ToString());
    for (int r = 0; r < w; ++r) RANK_EXPECT(g.rank(), sizes[r] == 100);
    s = g.Barrier();
    RANK_EXPECT(g.rank(), s.ok(), s.ToString());
    return ExchangeAndCheck(g, 3, 0);
  }));
}

// Every rank draws the same operations from the same seed; each checks its results, and
// the digests of the results that every rank shares are compared at the end.
TEST_P(ShmCollectivesTest, LongRandomSequenceAgreesOnEveryRank) {
  ExpectAllOk(RunGroup(world(), UniqueName("mixed"), [](ShmCollectives& g) {
    const int w = g.world_size();
    const int me = g.rank();
    std::mt19937_64 rng(42);
    uint64_t digest = 1469598103934665603ULL;
    const auto mix = [&digest](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) digest = (digest ^ b[i]) * 1099511628211ULL;
    };
    for (int op = 0; op < 300; ++op) {
      const int kind = static_cast<int>(rng() % 5);
      const size_t n = rng() % 3 == 0 ? rng() % 6000 : rng() % 40;
      const int root = static_cast<int>(rng() % w);
      const int salt = static_cast<int>(rng() % 8);
      absl::Status s;
      if (kind == 0) {
        std::vector<float> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = Input(me, i, op);
        s = g.AllReduceSum(data);
        const std::vector<float> want = RankOrderSum(w, n, op);
        RANK_EXPECT(me, s.ok() && (n == 0 || std::memcmp(data.data(), want.data(), n * 4) == 0),
                    "op ", op, " ", s.ToString());
        mix(data.data(), n * 4);
      } else if (kind == 1) {
        std::vector<std::byte> send(n), recv(n * w);
        for (size_t i = 0; i < n; ++i) send[i] = Pattern(me, op, i);
        s = g.AllGather(send, recv);
        RANK_EXPECT(me, s.ok(), "op ", op, " ", s.ToString());
        for (int r = 0; r < w; ++r) {
          for (size_t i = 0; i < n; ++i) RANK_EXPECT(me, recv[r * n + i] == Pattern(r, op, i), "op ", op);
        }
        mix(recv.data(), recv.size());
      } else if (kind == 2) {
        std::vector<std::byte> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = me == root ? Pattern(root, op, i) : std::byte{0};
        s = g.Broadcast(data, root);
        RANK_EXPECT(me, s.ok(), "op ", op, " ", s.ToString());
        for (size_t i = 0; i < n; ++i) RANK_EXPECT(me, data[i] == Pattern(root, op, i), "op ", op);
        mix(data.data(), n);
      } else if (kind == 3) {
        if (int rc = ExchangeAndCheck(g, salt, n % 2); rc != 0) return rc;
      } else {
        s = g.Barrier();
        RANK_EXPECT(me, s.ok(), "op ", op, " ", s.ToString());
      }
    }
    std::vector<uint64_t> digests(w);
    absl::Status s = g.AllGather(std::as_bytes(std::span(&digest, 1)), std::as_writable_bytes(std::span(digests)));
    RANK_EXPECT(me, s.ok(), s.ToString());
    for (int r = 0; r < w; ++r) RANK_EXPECT(me, digests[r] == digest, "rank ", r, "'s digest");
    return 0;
  }));
}

TEST_P(ShmCollectivesTest, FileUnderAGivenDirectoryWorksAndIsRemoved) {
  char dir_template[] = "/tmp/tandem-parallel-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string name = UniqueName("dir");
  ExpectAllOk(RunGroup(
      world(), name,
      [](ShmCollectives& g) {
        std::vector<float> data(3001);
        for (size_t i = 0; i < data.size(); ++i) data[i] = Input(g.rank(), i);
        absl::Status s = g.AllReduceSum(data);
        RANK_EXPECT(g.rank(), s.ok(), s.ToString());
        const std::vector<float> want = RankOrderSum(g.world_size(), data.size());
        RANK_EXPECT(g.rank(), std::memcmp(data.data(), want.data(), data.size() * 4) == 0);
        return 0;
      },
      [&dir](ShmGroupOptions& o) { o.directory = dir; }));
  EXPECT_NE(::access(SegmentPath({name, dir}).c_str(), F_OK), 0);
  EXPECT_EQ(::rmdir(dir.c_str()), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmCollectivesTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "ranks");
                         });

}  // namespace
}  // namespace tandem::parallel
