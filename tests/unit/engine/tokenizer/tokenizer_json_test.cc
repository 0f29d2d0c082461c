// Loading tokenizer.json / tokenizer_config.json: errors name the problem, and the parts
// that change ids (added tokens, post-processor, BOS/EOS from the config) behave.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// A small byte-level tokenizer: a, b, c, Ġ and merges "a b", "Ġ a".
Json MinimalTokenizer() {
  return Json::parse(R"({
    "version": "1.0",
    "added_tokens": [
      {"id": 6, "content": "<s>", "special": true, "normalized": false,
       "single_word": false, "lstrip": false, "rstrip": false},
      {"id": 7, "content": "</s>", "special": true, "normalized": false,
       "single_word": false, "lstrip": false, "rstrip": false}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "ByteLevel"},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "\u0120a": 5},
              "merges": ["a b", ["\u0120", "a"]]}
  })");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const Json& json, const std::string& config = "") {
  return Tokenizer::FromJson(json.dump(), config);
}

void ExpectInvalid(const Json& json, const std::string& needle, const std::string& config = "") {
  auto tokenizer = Load(json, config);
  ASSERT_FALSE(tokenizer.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tokenizer.status().message().find(needle), absl::string_view::npos)
      << tokenizer.status();
}

TEST(TokenizerJsonTest, MinimalTokenizerWorks) {
  auto tokenizer = Load(MinimalTokenizer());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.vocab_size(), 8);
  EXPECT_EQ(t.Encode("ab a<s>c", false), (Ids{4, 5, 6, 2}));
  EXPECT_EQ(t.Encode("ab a<s>c", true), (Ids{4, 5, 6, 2}));  // ByteLevel adds nothing
  EXPECT_EQ(t.Decode(Ids{4, 5, 6, 2}, false), "ab a<s>c");
  EXPECT_EQ(t.Decode(Ids{4, 5, 6, 2, 99, -1}, true), "ab ac");
  EXPECT_TRUE(t.IsSpecial(6));
  EXPECT_FALSE(t.IsSpecial(4));
  EXPECT_EQ(t.TokenToId("\u0120a"), 5);
  EXPECT_EQ(t.TokenToId("</s>"), 7);
  EXPECT_EQ(t.IdToToken(5), "\u0120a");
  EXPECT_EQ(t.IdToToken(42), "");
  EXPECT_EQ(t.TokenBytes(5), " a");
  EXPECT_EQ(t.TokenBytes(7), "</s>");
  EXPECT_FALSE(t.bos_id().has_value());
}

TEST(TokenizerJsonTest, MalformedJsonIsInvalidArgument) {
  auto tokenizer = Tokenizer::FromJson("{\"model\": [1, 2", "");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tokenizer.status().message().find("tokenizer.json: malformed JSON"),
            absl::string_view::npos)
      << tokenizer.status();
  auto config = Load(MinimalTokenizer(), "{oops}");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("tokenizer_config.json: malformed JSON"),
            absl::string_view::npos)
      << config.status();
}

TEST(TokenizerJsonTest, ErrorsNameTheField) {
  Json json = MinimalTokenizer();
  json["model"]["vocab"] = Json::array();
  ExpectInvalid(json, "model.vocab");

  json = MinimalTokenizer();
  json["model"]["vocab"]["a"] = "zero";
  ExpectInvalid(json, "model.vocab.a");

  json = MinimalTokenizer();
  json["model"]["merges"][0] = "a b c";
  ExpectInvalid(json, "model.merges[0]");

  json = MinimalTokenizer();
  json["model"]["merges"].push_back("a c");
  ExpectInvalid(json, "model: merges[2]: merged token 'ac' is not in the vocabulary");

  json = MinimalTokenizer();
  json.erase("model");
  ExpectInvalid(json, "tokenizer.json: model: missing");

  json = MinimalTokenizer();
  json["added_tokens"][1]["content"] = 5;
  ExpectInvalid(json, "added_tokens[1].content");

  json = MinimalTokenizer();
  json["added_tokens"][0]["special"] = "yes";
  ExpectInvalid(json, "added_tokens[0].special");

  json = MinimalTokenizer();
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  ExpectInvalid(json, "pre_tokenizer.pattern");

  json = MinimalTokenizer();
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
  ExpectInvalid(json, "pre_tokenizer.behavior");

  json = MinimalTokenizer();
  json["model"]["dropout"] = 0.1;
  ExpectInvalid(json, "model.dropout");

  json = MinimalTokenizer();
  json["version"] = "2.0";
  ExpectInvalid(json, "version");
}

TEST(TokenizerJsonTest, UnsupportedComponentsAreNamed) {
  Json json = MinimalTokenizer();
  json["normalizer"] = {{"type", "NFKC"}};
  ExpectInvalid(json, "normalizer: type 'NFKC' is not supported");

  json = MinimalTokenizer();
  json["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}};
  ExpectInvalid(json, "normalizer.normalizers[0]: type 'Lowercase'");

  json = MinimalTokenizer();
  json["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Metaspace"}}}}};
  ExpectInvalid(json, "pre_tokenizer.pretokenizers[0]: type 'Metaspace'");

  json = MinimalTokenizer();
  json["model"]["type"] = "WordPiece";
  ExpectInvalid(json, "model: type 'WordPiece'");

  json = MinimalTokenizer();
  json["decoder"] = {{"type", "Metaspace"}};
  ExpectInvalid(json, "decoder: type 'Metaspace'");

  json = MinimalTokenizer();
  json["post_processor"] = {{"type", "Whatever"}};
  ExpectInvalid(json, "post_processor: type 'Whatever'");

  // An empty Sequence normalizer (as DeepSeek ships) is fine.
  json = MinimalTokenizer();
  json["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array()}};
  EXPECT_TRUE(Load(json).ok());
}

TEST(TokenizerJsonTest, MissingFileIsNotFound) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "tandem_tokenizer_json_test_missing").string();
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir + "/tokenizer.json");
  auto tokenizer = Tokenizer::FromDir(dir);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound) << tokenizer.status();
  EXPECT_EQ(Tokenizer::FromDir(dir + "/no/such/dir").status().code(), absl::StatusCode::kNotFound);

  // With tokenizer.json present and no config, it loads.
  std::ofstream(dir + "/tokenizer.json") << MinimalTokenizer().dump();
  std::filesystem::remove(dir + "/tokenizer_config.json");
  EXPECT_TRUE(Tokenizer::FromDir(dir).ok());
  std::filesystem::remove_all(dir);
}

TEST(TokenizerJsonTest, ConfigAddsBosAndEos) {
  auto bos_only = Load(MinimalTokenizer(), R"({"add_bos_token": true, "add_eos_token": false,
      "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"})");
  ASSERT_TRUE(bos_only.ok()) << bos_only.status();
  EXPECT_EQ((*bos_only)->bos_id(), 6);
  EXPECT_EQ((*bos_only)->eos_id(), 7);
  EXPECT_EQ((*bos_only)->Encode("ab", true), (Ids{6, 4}));
  EXPECT_EQ((*bos_only)->Encode("ab", false), (Ids{4}));
  EXPECT_EQ((*bos_only)->Encode("", true), (Ids{6}));

  auto both = Load(MinimalTokenizer(), R"({"add_bos_token": true, "add_eos_token": true,
      "bos_token": "<s>", "eos_token": "</s>"})");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)->Encode("ab", true), (Ids{6, 4, 7}));

  auto no_flags = Load(MinimalTokenizer(), R"({"bos_token": "<s>", "eos_token": null})");
  ASSERT_TRUE(no_flags.ok()) << no_flags.status();
  EXPECT_EQ((*no_flags)->bos_id(), 6);
  EXPECT_FALSE((*no_flags)->eos_id().has_value());
  EXPECT_EQ((*no_flags)->Encode("ab", true), (Ids{4}));

  ExpectInvalid(MinimalTokenizer(), "bos_token",
                R"({"add_bos_token": true, "bos_token": "<nope>"})");
  ExpectInvalid(MinimalTokenizer(), "add_eos_token", R"({"add_eos_token": "yes"})");
}

TEST(TokenizerJsonTest, TemplateProcessingAppliesWithSpecialTokens) {
  Json json = MinimalTokenizer();
  json["post_processor"] = Json::parse(R"({
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "</s>", "type_id": 0}}],
    "pair": [],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [6], "tokens": ["<s>"]},
                       "</s>": {"id": "</s>", "ids": [7], "tokens": ["</s>"]}}
  })");
  auto tokenizer = Load(json);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->Encode("ab", true), (Ids{6, 4, 7}));
  EXPECT_EQ((*tokenizer)->Encode("ab", false), (Ids{4}));
  // tokenizer_config.json's add_bos_token replaces the template (as LlamaTokenizerFast).
  auto overridden = Load(json, R"({"add_bos_token": true, "bos_token": "<s>"})");
  ASSERT_TRUE(overridden.ok());
  EXPECT_EQ((*overridden)->Encode("ab", true), (Ids{6, 4}));

  json["post_processor"] = Json::parse(R"({"type": "Sequence", "processors": [
    {"type": "ByteLevel"}, {"type": "BertProcessing", "sep": ["</s>", 7], "cls": ["<s>", 6]}]})");
  auto sequence = Load(json);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  EXPECT_EQ((*sequence)->Encode("ab", true), (Ids{6, 4, 7}));
}

TEST(TokenizerJsonTest, InvalidUtf8InputIsRepairedFirst) {
  auto tokenizer = Load(MinimalTokenizer());
  ASSERT_TRUE(tokenizer.ok());
  // U+FFFD has no tokens in this vocabulary (its bytes are not in it), so it vanishes.
  EXPECT_EQ((*tokenizer)
                ->Encode("ab\xFF"
                         "ab",
                         false),
            (Ids{4, 4}));
}

}  // namespace
}  // namespace tandem
