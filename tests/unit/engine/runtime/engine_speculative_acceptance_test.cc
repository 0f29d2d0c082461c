// Speculative decoding through the engine on make-model --mtp-acceptance P checkpoints
// (engine/model/mtp_test_model.h): greedy outputs follow the construction's successor,
// and the acceptance the engine counts is the construction's: P for a first draft and P
// again for each later draft given the ones before it.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "engine/model/model_generator.h"
#include "engine/model/mtp_test_model.h"
#include "engine/runtime/engine.h"
#include "engine/util/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/runtime/engine_test_support.h"

namespace tandem {
namespace {

TEST(EngineSpeculativeAcceptanceTest, AcceptanceIsTheConstructionsRate) {
  for (double p : {0.25, 0.75}) {
    testing::TempDir tmp;
    const std::string dir = testing::MakeMtpTestModel(tmp, "m", 1024, /*seed=*/5, p);
    const MtpTestTokens tokens = testing::MtpTestTokensOf(dir);

    EngineOptions engine_options;
    engine_options.num_threads = 2;
    engine_options.speculative_tokens = 3;
    engine_options.speculative_adaptive = false;  // every step drafts: the test counts them
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(dir, engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::shared_ptr<OutputStream>> streams;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 16; ++i) {
      prompts.push_back(testing::Tokens(5 + 7 * i, i));
      absl::StatusOr<std::shared_ptr<OutputStream>> s =
          (*engine)->Submit(testing::GreedyRequest(absl::StrCat("r", i), prompts.back(), 96));
      ASSERT_TRUE(s.ok()) << s.status();
      streams.push_back(*s);
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      std::vector<int32_t> out;
      RequestOutput output;
      while (streams[i]->Next(&output)) {
        ASSERT_TRUE(output.status.ok()) << output.status;
        out.insert(out.end(), output.token_ids.begin(), output.token_ids.end());
      }
      ASSERT_EQ(out.size(), 96u);
      int32_t previous = prompts[i].back();
      for (size_t j = 0; j < out.size(); ++j) {
        ASSERT_EQ(out[j], tokens.Successor(previous)) << "request " << i << ", token " << j;
        previous = out[j];
      }
    }
    const EngineStats st = (*engine)->Stats();
    int64_t steps = 0;
    for (int64_t n : st.spec_accepted_length) steps += n;
    std::printf("P %.2f: %lld drafts, %lld verify steps; accepted by position:", p,
                static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(steps));
    for (int64_t n : st.spec_accepted_by_position) std::printf(" %lld", static_cast<long long>(n));
    std::printf("; steps by accepted count:");
    for (int64_t n : st.spec_accepted_length) std::printf(" %lld", static_cast<long long>(n));
    std::printf("\n");
    // Draft k is accepted when the k before it were and the token it was drafted from is
    // good: each rate is the good fraction of the tokens the sequences pass through, a
    // binomial sample around P. The tolerances are over 4 standard deviations at the
    // counts these requests give (hundreds of steps at each position).
    ASSERT_EQ(st.spec_accepted_by_position.size(), 3u);
    const std::vector<int64_t>& accepted = st.spec_accepted_by_position;
    const double first = static_cast<double>(accepted[0]) / steps;
    const double second = static_cast<double>(accepted[1]) / accepted[0];
    const double third = static_cast<double>(accepted[2]) / accepted[1];
    std::printf("P %.2f: first-draft acceptance %.3f, second given first %.3f, third given second %.3f\n", p,
                first, second, third);
    EXPECT_NEAR(first, p, 0.08);
    EXPECT_NEAR(second, p, 0.12);
    if (p > 0.5) {  // at P = 0.25 too few second drafts are accepted to tell
      EXPECT_NEAR(third, p, 0.12);
    }
  }
}

}  // namespace
}  // namespace tandem
