#include "engine/runtime/sampling_params.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace tandem {
namespace {

constexpr int64_t kVocab = 1000;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void ExpectInvalid(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos)
      << "message does not name " << field << ": " << status.message();
}

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(Validate(SamplingParams{}, kVocab).ok());
  EXPECT_TRUE(Validate(StopParams{}, kVocab).ok());
  const SamplingParams p;
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_EQ(p.logprobs, 0);
  const StopParams s;
  EXPECT_EQ(s.max_tokens, 256);
  EXPECT_EQ(s.min_tokens, 0);
  EXPECT_FALSE(s.ignore_eos);
  EXPECT_FALSE(s.include_stop_str_in_output);
}

TEST(SamplingParamsTest, AcceptsBoundaryValues) {
  const std::vector<std::function<void(SamplingParams&)>> edits = {
      [](SamplingParams& p) { p.temperature = 0.0f; },
      [](SamplingParams& p) { p.temperature = 100.0f; },
      [](SamplingParams& p) { p.top_p = 1e-6f; },
      [](SamplingParams& p) { p.top_k = -1; },
      [](SamplingParams& p) { p.top_k = 1 << 30; },  // larger than the vocabulary: off
      [](SamplingParams& p) { p.min_p = 1.0f; },
      [](SamplingParams& p) { p.repetition_penalty = 10.0f; },
      [](SamplingParams& p) { p.repetition_penalty = 0.01f; },
      [](SamplingParams& p) { p.presence_penalty = -2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = 2.0f; },
      [](SamplingParams& p) { p.logprobs = 20; },
      [](SamplingParams& p) { p.seed = ~uint64_t{0}; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    SamplingParams p;
    edits[i](p);
    EXPECT_TRUE(Validate(p, kVocab).ok()) << i << ": " << Validate(p, kVocab);
  }
}

TEST(SamplingParamsTest, RejectsOutOfRangeNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(SamplingParams&)> edit;
  };
  const std::vector<Case> cases = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = 100.5f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kNaN; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNaN; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNaN; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 10.5f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kInf; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -kInf; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.5f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = kNaN; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = -1; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.edit(p);
    SCOPED_TRACE(c.field);
    ExpectInvalid(Validate(p, kVocab), c.field);
  }
}

TEST(StopParamsTest, RejectsOutOfRangeNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(StopParams&)> edit;
  };
  const std::vector<Case> cases = {
      {"max_tokens", [](StopParams& p) { p.max_tokens = 0; }},
      {"max_tokens", [](StopParams& p) { p.max_tokens = -5; }},
      {"min_tokens", [](StopParams& p) { p.min_tokens = -1; }},
      {"min_tokens", [](StopParams& p) { p.max_tokens = 10; p.min_tokens = 11; }},
      {"stop_token_ids[1]", [](StopParams& p) { p.stop_token_ids = {5, kVocab}; }},
      {"stop_token_ids[0]", [](StopParams& p) { p.stop_token_ids = {-1}; }},
      {"stop[1]", [](StopParams& p) { p.stop = {"a", ""}; }},
      {"stop[0]", [](StopParams& p) { p.stop = {std::string(257, 'x')}; }},
      {"stop[0]", [](StopParams& p) { p.stop = {"\xF0\x9F\x98"}; }},  // truncated emoji
      {"stop[0]", [](StopParams& p) { p.stop = {"\xC0\xAF"}; }},      // overlong
      {"stop", [](StopParams& p) { p.stop.assign(17, "x"); }},
  };
  for (const Case& c : cases) {
    StopParams p;
    c.edit(p);
    SCOPED_TRACE(c.field);
    ExpectInvalid(Validate(p, kVocab), c.field);
  }
}

TEST(StopParamsTest, AcceptsBoundaryValues) {
  StopParams p;
  p.max_tokens = 1;
  p.min_tokens = 1;
  p.stop.assign(16, std::string(256, 'x'));
  p.stop[0] = "\xF0\x9F\x98\x80 \xE4\xB8\xAD";  // emoji, CJK
  p.stop_token_ids = {0, kVocab - 1};
  EXPECT_TRUE(Validate(p, kVocab).ok()) << Validate(p, kVocab);
}

TEST(SamplingParamsTest, LogitBiasIsBoundedAndNamed) {
  SamplingParams p;
  p.logit_bias = {{0, -100.0f}, {999, 100.0f}, {5, 0.5f}};
  EXPECT_TRUE(Validate(p, kVocab).ok());
  p.logit_bias = {{1000, 1.0f}};
  ExpectInvalid(Validate(p, kVocab), "logit_bias: token id 1000");
  p.logit_bias = {{-1, 1.0f}};
  ExpectInvalid(Validate(p, kVocab), "logit_bias: token id -1");
  for (float bad : {100.5f, -101.0f, kNaN, kInf}) {
    p.logit_bias = {{3, bad}};
    ExpectInvalid(Validate(p, kVocab), "logit_bias: the bias of token 3");
  }
  p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  ExpectInvalid(Validate(p, kVocab), "appears twice");
  p.logit_bias.clear();
  for (int32_t i = 0; i <= static_cast<int32_t>(kMaxLogitBias); ++i) p.logit_bias.emplace_back(i % kVocab, 1.0f);
  ExpectInvalid(Validate(p, 1 << 20), "logit_bias: at most 1024");
}

}  // namespace
}  // namespace tandem
