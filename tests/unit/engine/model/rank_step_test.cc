// The step plan rank 0 broadcasts to the other ranks: every field survives the trip, and
// bytes that are not a whole plan are an error.
#include "engine/model/rank_step.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(RankStepTest, RoundTripsEveryField) {
  const std::vector<int32_t> t0 = {5, 6, 7}, b0 = {3, 1}, t1 = {9}, b1 = {};
  std::vector<ForwardSequence> batch = {
      {.tokens = t0, .start_position = 12, .block_table = b0, .all_logits = true, .state_slot = 4,
       .mtp = true, .mtp_next_token = 77, .first_kv_cached = true, .num_drafts = 2, .dp_rank = 3},
      {.tokens = t1, .start_position = 0, .block_table = b1, .no_logits = true, .keep_hidden = true},
  };
  const std::vector<std::byte> bytes = EncodeRankStep(batch, 321);
  absl::StatusOr<RankStep> plan = DecodeRankStep(bytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_blocks, 321);
  ASSERT_EQ(plan->batch.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ForwardSequence& a = batch[i];
    const ForwardSequence& b = plan->batch[i];
    EXPECT_EQ(std::vector<int32_t>(a.tokens.begin(), a.tokens.end()),
              std::vector<int32_t>(b.tokens.begin(), b.tokens.end()));
    EXPECT_EQ(std::vector<int32_t>(a.block_table.begin(), a.block_table.end()),
              std::vector<int32_t>(b.block_table.begin(), b.block_table.end()));
    EXPECT_EQ(a.start_position, b.start_position);
    EXPECT_EQ(a.all_logits, b.all_logits);
    EXPECT_EQ(a.no_logits, b.no_logits);
    EXPECT_EQ(a.state_slot, b.state_slot);
    EXPECT_EQ(a.mtp, b.mtp);
    EXPECT_EQ(a.mtp_next_token, b.mtp_next_token);
    EXPECT_EQ(a.keep_hidden, b.keep_hidden);
    EXPECT_EQ(a.first_kv_cached, b.first_kv_cached);
    EXPECT_EQ(a.num_drafts, b.num_drafts);
    EXPECT_EQ(a.dp_rank, b.dp_rank);
  }
  // The views stay valid when the plan moves.
  RankStep moved = std::move(*plan);
  EXPECT_EQ(moved.batch[0].tokens[2], 7);
}

TEST(RankStepTest, TruncatedOrLongerBytesAreRefused) {
  const std::vector<int32_t> t = {1, 2};
  const ForwardSequence s{.tokens = t};
  std::vector<std::byte> bytes = EncodeRankStep({&s, 1}, 8);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeRankStep(std::span(bytes).first(n)).status().code(), absl::StatusCode::kInvalidArgument) << n;
  }
  bytes.push_back(std::byte{0});
  EXPECT_EQ(DecodeRankStep(bytes).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
