// The model-neutral KV stream description: what a paging layer may be given (validation
// errors name the stream and the field) and the bytes it then pages or carries.
#include "engine/model/kv_streams.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

KvStream PerToken(std::vector<int32_t> layers, int32_t width = 576) {
  return {.name = "latent", .dtype = "f32", .granularity = KvGranularity::kPerToken, .tokens = 1, .width = width,
          .layers = std::move(layers)};
}

void ExpectInvalid(const std::vector<KvStream>& streams, const std::string& says, int32_t num_layers = 4) {
  const absl::Status s = ValidateKvStreams(streams, num_layers, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(says), std::string::npos) << s;
}

TEST(KvStreamsTest, BadStreamsAreNamedInTheError) {
  EXPECT_TRUE(ValidateKvStreams({PerToken({0, 1, 2, 3})}, 4, 64).ok());
  ExpectInvalid({}, "no streams");
  ExpectInvalid({PerToken({0, 1}), PerToken({2})}, "'latent': named twice");
  KvStream s = PerToken({0});
  s.dtype = "f16";
  ExpectInvalid({s}, "'latent': unknown dtype 'f16'");
  ExpectInvalid({PerToken({0}, 0)}, "'latent': width 0");
  ExpectInvalid({PerToken({})}, "'latent': on no layer");
  ExpectInvalid({PerToken({0, 4})}, "'latent': layer 4 outside 0..3");
  ExpectInvalid({PerToken({1, 1})}, "not ascending and unique");
  ExpectInvalid({PerToken({2, 1})}, "not ascending and unique");
  s = PerToken({0});
  s.tokens = 2;
  ExpectInvalid({s}, "per-token stream has tokens 1");
  s = {.name = "w", .dtype = "f32", .granularity = KvGranularity::kPerWindow, .tokens = 48, .width = 8, .layers = {0}};
  ExpectInvalid({s}, "'w': windows of 48 tokens neither divide nor are a multiple of the 64-token block");
  s.tokens = 96;
  ExpectInvalid({s}, "windows of 96 tokens");
  s.tokens = 0;
  ExpectInvalid({s}, "'w': tokens 0");
  EXPECT_EQ(ValidateKvStreams({PerToken({0})}, 4, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStreamsTest, PagedBytesCountEveryEntryABlockHolds) {
  const KvStream latent = PerToken({0, 1, 2}, 576);
  EXPECT_EQ(EntriesPerBlock(latent, 64), 64);
  EXPECT_EQ(PagedBytesPerBlock({latent}, 64), 3 * 64 * 576 * 4);  // V2/V3: layers x block x entry x f32
  const KvStream csa{.name = "csa", .dtype = "bf16", .granularity = KvGranularity::kPerWindow, .tokens = 4,
                     .width = 512, .layers = {1}};
  const KvStream hca{.name = "hca", .dtype = "fp8_e4m3", .granularity = KvGranularity::kPerWindow, .tokens = 128,
                     .width = 512, .layers = {0, 2}};
  EXPECT_EQ(EntriesPerBlock(csa, 64), 16);
  EXPECT_EQ(EntriesPerBlock(hca, 64), 1);  // one slot, used by every other block
  const KvStream ring{.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing, .tokens = 128,
                      .width = 512, .layers = {0, 1, 2}};
  const KvStream state{.name = "state", .dtype = "f32", .granularity = KvGranularity::kSequenceState, .tokens = 20,
                       .width = 128, .layers = {1}};
  const std::vector<KvStream> all = {latent, csa, hca, ring, state};
  ASSERT_TRUE(ValidateKvStreams(all, 3, 64).ok());
  EXPECT_EQ(PagedBytesPerBlock(all, 64), 3 * 64 * 576 * 4 + 16 * 512 * 2 + 2 * 1 * 512 * 1);
  EXPECT_EQ(SequenceStateBytes(all), 3 * 128 * 512 * 4 + 20 * 128 * 4);
  EXPECT_EQ(DescribeKvStreams({latent, ring}),
            "latent: per token x 576 f32 on 3 layers; window: ring of 128 x 512 f32 on 3 layers");
}

}  // namespace
}  // namespace tandem
