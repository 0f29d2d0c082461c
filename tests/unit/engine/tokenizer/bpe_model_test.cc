#include "engine/tokenizer/bpe_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace tandem::tokenizer_internal {
namespace {

using Vocab = std::vector<std::pair<std::string, int32_t>>;
using Merges = std::vector<std::pair<std::string, std::string>>;

std::unique_ptr<BpeModel> Make(Vocab vocab, Merges merges, BpeOptions options = {}) {
  auto model = BpeModel::Create(std::move(vocab), merges, std::move(options));
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

std::vector<int32_t> Ids(const BpeModel& model, std::string_view piece) {
  std::vector<int32_t> ids;
  model.Tokenize(piece, &ids);
  return ids;
}

TEST(BpeModelTest, LowestRankMergesFirst) {
  // "b c" outranks "a b": abc -> a bc, even though "a b" is leftmost.
  auto model = Make({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}}, {{"b", "c"}, {"a", "b"}});
  EXPECT_EQ(Ids(*model, "abc"), (std::vector<int32_t>{0, 4}));
  auto flipped =
      Make({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}}, {{"a", "b"}, {"b", "c"}});
  EXPECT_EQ(Ids(*flipped, "abc"), (std::vector<int32_t>{3, 2}));
}

TEST(BpeModelTest, LeftmostWinsOnEqualRank) {
  auto model = Make({{"a", 0}, {"aa", 1}}, {{"a", "a"}});
  EXPECT_EQ(Ids(*model, "aaa"), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(Ids(*model, "aaaaa"), (std::vector<int32_t>{1, 1, 0}));
}

TEST(BpeModelTest, MergesChainAndRevisitNeighbours) {
  auto model = Make({{"a", 0}, {"b", 1}, {"aa", 2}, {"aaaa", 3}, {"ab", 4}, {"aaab", 5}},
                    {{"a", "a"}, {"aa", "aa"}, {"a", "b"}, {"aa", "ab"}});
  EXPECT_EQ(Ids(*model, "aaaa"), (std::vector<int32_t>{3}));
  EXPECT_EQ(Ids(*model, "aaab"), (std::vector<int32_t>{5}));  // aa a b -> aa ab -> aaab
  EXPECT_EQ(Ids(*model, "aaaaaaaa"), (std::vector<int32_t>{3, 3}));
}

TEST(BpeModelTest, UnknownCharactersAreDroppedWithoutUnkToken) {
  auto model = Make({{"a", 0}, {"b", 1}, {"ab", 2}}, {{"a", "b"}});
  // é is dropped; a and b are then neighbours and merge, as in Hugging Face.
  EXPECT_EQ(Ids(*model,
                "a\xC3\xA9"
                "b"),
            (std::vector<int32_t>{2}));
}

TEST(BpeModelTest, UnkTokenFusedOrNot) {
  BpeOptions fused;
  fused.unk_token = "<unk>";
  fused.fuse_unk = true;
  auto model = Make({{"<unk>", 0}, {"a", 1}}, {}, fused);
  EXPECT_EQ(Ids(*model, "xya"), (std::vector<int32_t>{0, 1}));
  BpeOptions separate;
  separate.unk_token = "<unk>";
  auto model2 = Make({{"<unk>", 0}, {"a", 1}}, {}, separate);
  EXPECT_EQ(Ids(*model2, "xya"), (std::vector<int32_t>{0, 0, 1}));
}

TEST(BpeModelTest, ByteFallback) {
  BpeOptions options;
  options.byte_fallback = true;
  auto model = Make({{"a", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}}, {}, options);
  EXPECT_EQ(Ids(*model, "a\xC3\xA9"), (std::vector<int32_t>{0, 1, 2}));
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  BpeOptions options;
  options.ignore_merges = true;
  // "abc" is in the vocabulary but no merge sequence forms it.
  auto model = Make({{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"ab", 4}}, {{"a", "b"}}, options);
  EXPECT_EQ(Ids(*model, "abc"), (std::vector<int32_t>{3}));
  EXPECT_EQ(Ids(*model, "abca"), (std::vector<int32_t>{4, 2, 0}));
}

TEST(BpeModelTest, ContinuingSubwordPrefixAndSuffix) {
  BpeOptions options;
  options.continuing_subword_prefix = "##";
  auto model = Make({{"a", 0}, {"##b", 1}, {"ab", 2}}, {{"a", "##b"}}, options);
  EXPECT_EQ(Ids(*model, "ab"), (std::vector<int32_t>{2}));
  BpeOptions suffix;
  suffix.end_of_word_suffix = "</w>";
  auto model2 = Make({{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}}, {{"a", "b</w>"}}, suffix);
  EXPECT_EQ(Ids(*model2, "ab"), (std::vector<int32_t>{2}));
}

TEST(BpeModelTest, MergeWithTokenMissingFromVocabIsInvalid) {
  auto model = BpeModel::Create({{"a", 0}, {"b", 1}}, {{"a", "b"}}, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("'ab'"), absl::string_view::npos) << model.status();
  auto missing = BpeModel::Create({{"a", 0}}, {{"a", "z"}}, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'z'"), absl::string_view::npos);
}

TEST(BpeModelTest, LongRunOfOneLetterGrowsAsNLogN) {
  // Merges that double: a, aa, aaaa, ... as GPT-style vocabularies have for repeated chars.
  Vocab vocab = {{"a", 0}};
  Merges merges;
  std::string token = "a";
  for (int i = 1; i <= 8; ++i) {
    merges.emplace_back(token, token);
    token += token;
    vocab.emplace_back(token, i);
  }
  auto model = Make(vocab, merges, BpeOptions{.cache_capacity = 0});
  const std::string word(100000, 'a');
  const auto ids = Ids(*model, word);
  // 100000 = 390 x 256 + 128 + 32, the leftovers at the end (leftmost merges first).
  ASSERT_EQ(ids.size(), 392u);
  EXPECT_EQ(ids[0], 8);
  EXPECT_EQ(ids[390], 7);
  EXPECT_EQ(ids[391], 5);
  // Growth, not speed: a word 8x longer takes about 9.6x as long if the merge loop is
  // O(n log n), 64x if quadratic; the bound sits between. Both lengths are measured in this
  // run, best of three, so a loaded machine slows both alike.
  auto best_seconds = [&](size_t n) {
    const std::string w(n, 'a');
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      const auto out = Ids(*model, w);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      EXPECT_FALSE(out.empty());
    }
    return best;
  };
  const double short_s = best_seconds(25000);
  const double long_s = best_seconds(200000);
  EXPECT_LT(long_s, 24.0 * short_s) << "25k letters " << short_s << " s, 200k letters " << long_s << " s";
}

TEST(BpeModelTest, ConcurrentTokenizeAgrees) {
  auto model = Make({{"a", 0}, {"b", 1}, {"ab", 2}, {"abab", 3}}, {{"a", "b"}, {"ab", "ab"}});
  const std::vector<int32_t> expected = Ids(*model, "ababab");
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        std::string word = std::string(static_cast<size_t>(i % 7), 'a') + "ababab";
        std::vector<int32_t> ids;
        model->Tokenize(word.substr(i % 7), &ids);
        if (ids != expected) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace tandem::tokenizer_internal
