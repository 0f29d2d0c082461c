// ExpertParallelMoe on its own, in the shape data-parallel attention will give it: every
// rank its own number of rows (zero included), routed anywhere. Each row's result is
// bitwise the one-rank sum over its experts in id order, whatever the ranks and the
// experts' placement (8 experts over 2, 3 and 8 ranks, and over 4 with 3 experts).
#include "engine/model/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/engine/parallel/group_test_util.h"

namespace tandem {
namespace {

using parallel::testing::ExpectAllOk;
using parallel::testing::Input;
using parallel::testing::RunGroup;
using parallel::testing::UniqueName;

constexpr int64_t kHidden = 24;
constexpr int64_t kTopK = 3;

// Rank r's rows: a count that differs per rank (rank 1 has none).
int64_t RowsOf(int rank) { return rank == 1 ? 0 : 3 + 2 * rank; }

// An expert whose output depends on the expert and on the row's values.
void FakeExpert(int64_t e, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n * kHidden; ++i) y[i] = x[i] * static_cast<float>(e + 1) + Input(static_cast<int>(e), i % kHidden);
}

struct Rows {
  std::vector<float> x, weights;
  std::vector<int32_t> ids;
};

// Rank r's rows and their routing: distinct experts per row (offsets 6, 4, 2 differ modulo
// 3 and 8), not in id order.
Rows MakeRows(int rank, int64_t experts) {
  Rows r;
  const int64_t n = RowsOf(rank);
  for (int64_t i = 0; i < n * kHidden; ++i) r.x.push_back(Input(rank + 10, i));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < kTopK; ++k) {
      r.ids.push_back(static_cast<int32_t>((i * 5 + rank * 3 + (kTopK - k) * 2) % experts));
      r.weights.push_back(Input(rank + 20, i * kTopK + k));
    }
  }
  return r;
}

// The one-rank loop of DeepseekModel::Moe: experts in id order, each over its rows.
std::vector<float> OneRank(const Rows& r, int64_t experts) {
  const int64_t n = static_cast<int64_t>(r.x.size()) / kHidden;
  std::vector<float> out(r.x.size(), 0.0f), y(kHidden);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < kTopK; ++k) {
        if (r.ids[i * kTopK + k] != e) continue;
        FakeExpert(e, &r.x[i * kHidden], 1, y.data());
        AddWeightedExpertOutput(&out[i * kHidden], y.data(), r.weights[i * kTopK + k], kHidden);
      }
    }
  }
  return out;
}

void ExpectBitwise(int world, int64_t experts) {
  ExpectAllOk(RunGroup(world, UniqueName("ep"), [&](parallel::ShmCollectives& group) {
    const int rank = group.rank();
    const ParallelLayout layout{.rank = rank, .world = world, .expert_parallel = true};
    ExpertParallelMoe moe(group, layout, experts);
    const auto [first, last] = layout.LocalExperts(experts);
    for (int round = 0; round < 3; ++round) {  // buffers reused across calls
      const Rows r = MakeRows(rank + round, experts);
      std::vector<float> out(r.x.size(), -1.0f);
      absl::Status s = moe.Run({.x = r.x.data(), .rows = static_cast<int64_t>(r.x.size()) / kHidden,
                                .hidden = kHidden, .top_k = kTopK, .expert_ids = r.ids.data(),
                                .weights = r.weights.data()},
                               [&](int64_t e, const float* x, int64_t n, float* y) {
                                 if (e < first || e >= last) std::abort();  // only local experts run here
                                 FakeExpert(e, x, n, y);
                               },
                               out.data());
      RANK_EXPECT(rank, s.ok(), s.ToString());
      const std::vector<float> want = OneRank(r, experts);
      RANK_EXPECT(rank, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0, "round ", round);
    }
    return 0;
  }));
}

TEST(ExpertParallelMoeTest, UnevenRowsAreBitwiseOneRank) {
  ExpectBitwise(2, 8);
  ExpectBitwise(3, 8);
  ExpectBitwise(8, 8);
  ExpectBitwise(4, 3);  // a rank without experts
}

TEST(ExpertParallelMoeTest, OwnersMatchTheLocalRanges) {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int64_t experts : {int64_t{3}, int64_t{8}, int64_t{64}, int64_t{256}}) {
      for (int r = 0; r < world; ++r) {
        const ParallelLayout l{.rank = r, .world = world, .expert_parallel = true};
        const auto [first, last] = l.LocalExperts(experts);
        for (int64_t e = first; e < last; ++e) EXPECT_EQ(l.ExpertOwner(e, experts), r);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
