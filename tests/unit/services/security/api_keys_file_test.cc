#include "services/security/api_keys_file.h"

#include "gtest/gtest.h"

namespace tandem::security {
namespace {

constexpr char kKeyA[] = "aaaaaaaaaaaaaaaa1";
constexpr char kKeyB[] = "bbbbbbbbbbbbbbbb2";

TEST(ApiKeysFileTest, ParsesKeysNamesRatesAndSkipsCommentsAndBlankLines) {
  const std::string text = std::string("# keys of the team\n\n") + kKeyA + "\n  " + kKeyB +
                           "\tname=batch rps=2.5 burst=10  \n" + "cccccccccccccccc3 rps=4\n";
  absl::StatusOr<std::vector<ApiKey>> keys = ParseApiKeys(text, "keys.txt");
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 3u);
  EXPECT_EQ((*keys)[0].key, kKeyA);
  EXPECT_EQ((*keys)[0].name, "key-3");  // the default name says where it is
  EXPECT_EQ((*keys)[0].rps, 0);
  EXPECT_EQ((*keys)[1].key, kKeyB);
  EXPECT_EQ((*keys)[1].name, "batch");
  EXPECT_DOUBLE_EQ((*keys)[1].rps, 2.5);
  EXPECT_DOUBLE_EQ((*keys)[1].burst, 10);
  EXPECT_DOUBLE_EQ((*keys)[2].rps, 4);
  EXPECT_DOUBLE_EQ((*keys)[2].burst, 4);  // default burst: max(1, rps)
}

TEST(ApiKeysFileTest, ErrorsNameTheFileLineAndFieldButNeverTheKey) {
  struct Case {
    std::string text, expect;
  };
  const std::string key = kKeyA;
  for (const Case& c : std::vector<Case>{
           {"short\n", "line 1: the key has 5 characters"},
           {key + " rps=fast\n", "line 1: rps: 'fast' is not a number"},
           {key + " rps=-1\n", "line 1: rps"},
           {key + " colour=blue\n", "unknown field 'colour'"},
           {key + " loose\n", "field 'loose': expected name=, rps= or burst="},
           {key + " burst=5\n", "burst: needs rps"},
           {key + " rps=1 burst=0.5\n", "burst: must be at least 1"},
           {"# only comments\n\n", "holds no key"},
           {key + "\n" + key + "\n", "line 2: the same key appears on an earlier line"},
           {key + " name=x\n" + kKeyB + " name=x\n", "line 2: name 'x' is used twice"},
       }) {
    absl::StatusOr<std::vector<ApiKey>> keys = ParseApiKeys(c.text, "keys.txt");
    ASSERT_FALSE(keys.ok()) << c.text;
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(keys.status().message().find("--api-keys-file keys.txt"), std::string::npos) << keys.status();
    EXPECT_NE(keys.status().message().find(c.expect), std::string::npos) << keys.status();
    EXPECT_EQ(keys.status().message().find(kKeyA), std::string::npos) << "a key in a message: " << keys.status();
  }
}

TEST(ApiKeysFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadApiKeysFile("/nonexistent/keys").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::security
