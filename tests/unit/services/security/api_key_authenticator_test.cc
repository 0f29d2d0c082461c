#include "services/security/api_key_authenticator.h"

#include "gtest/gtest.h"

namespace tandem::security {
namespace {

using Clock = TokenBucket::Clock;

class ApiKeyAuthenticatorTest : public ::testing::Test {
 protected:
  ApiKeyAuthenticatorTest()
      : auth_({{.key = "open-key-0123456789", .name = "open"},
               {.key = "slow-key-0123456789", .name = "slow", .rps = 2, .burst = 2}},
              [this] { return now_; }) {}

  Clock::time_point now_{};
  ApiKeyAuthenticator auth_;
};

TEST_F(ApiKeyAuthenticatorTest, MissingOrWrongOrMalformedKeysAreUnauthenticated) {
  for (const char* header : {"", "open-key-0123456789", "Basic open-key-0123456789", "Bearer ",
                             "Bearer open-key-012345678", "Bearer open-key-01234567890", "Bearer OPEN-KEY-0123456789"}) {
    const ApiKeyDecision d = auth_.Authorize(header);
    EXPECT_EQ(d.status.code(), absl::StatusCode::kUnauthenticated) << "'" << header << "'";
    EXPECT_TRUE(d.key_name.empty());
  }
}

TEST_F(ApiKeyAuthenticatorTest, TheRightKeyIsAcceptedWhateverTheSchemeCase) {
  for (const char* header : {"Bearer open-key-0123456789", "bearer open-key-0123456789", "BEARER  open-key-0123456789 "}) {
    const ApiKeyDecision d = auth_.Authorize(header);
    EXPECT_TRUE(d.status.ok()) << header << ": " << d.status;
    EXPECT_EQ(d.key_name, "open");
  }
}

TEST_F(ApiKeyAuthenticatorTest, AKeyOverItsRateIsResourceExhaustedWithARetryHintAndOthersAreNotAffected) {
  EXPECT_TRUE(auth_.Authorize("Bearer slow-key-0123456789").status.ok());
  EXPECT_TRUE(auth_.Authorize("Bearer slow-key-0123456789").status.ok());
  ApiKeyDecision d = auth_.Authorize("Bearer slow-key-0123456789");
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.retry_after, std::chrono::milliseconds(500));  // 2 requests/s
  EXPECT_EQ(d.key_name, "slow");
  // The unlimited key is unlimited.
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(auth_.Authorize("Bearer open-key-0123456789").status.ok());
  // Reading pages takes nothing from the rate.
  EXPECT_TRUE(auth_.Authenticate("Bearer slow-key-0123456789").status.ok());
  now_ += std::chrono::milliseconds(499);
  EXPECT_EQ(auth_.Authorize("Bearer slow-key-0123456789").retry_after, std::chrono::milliseconds(1));
  now_ += std::chrono::milliseconds(1);
  EXPECT_TRUE(auth_.Authorize("Bearer slow-key-0123456789").status.ok());
}

TEST_F(ApiKeyAuthenticatorTest, AuthenticateIdentifiesWithoutRateAndRefusesUnknownKeys) {
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(auth_.Authenticate("Bearer slow-key-0123456789").status.ok());
  EXPECT_TRUE(auth_.Authorize("Bearer slow-key-0123456789").status.ok());
  EXPECT_EQ(auth_.Authenticate("Bearer nope").status.code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace tandem::security
