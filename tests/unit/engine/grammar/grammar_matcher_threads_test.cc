// Token masks filled on several threads at once, as the engine fills a step's constrained
// rows (Engine::FillDeviceMasks on its mask pool): matchers of one compiled grammar (and
// of several) at different states, each filled by whichever pool thread takes its row,
// give the masks the same matchers fill one after another. The compiled grammar is shared
// read-only; each matcher's scratch is its own. Run under ThreadSanitizer by
// scripts/tsan.sh (label tsan): a shared mutable cache would be reported there.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine/grammar/ebnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "engine/grammar/regex_to_grammar.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/unit/engine/grammar/test_grammars.h"
#include "tests/unit/engine/grammar/test_vocabulary.h"

namespace tandem::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const absl::StatusOr<Grammar>& g,
                                               const std::shared_ptr<const GrammarVocabulary>& vocab) {
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g, vocab, {});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(GrammarMatcherThreadsTest, MasksFilledOnAPoolEqualSerialOnes) {
  const std::shared_ptr<const GrammarVocabulary> vocab = testing::MakeTestVocabulary(1500, 600, 5);
  const std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      Compile(ParseEbnf(testing::kJsonEbnf), vocab),
      Compile(RegexToGrammar("[a-z]+(,[0-9]{1,3})*(\\.[A-Z_]?)?"), vocab),
      Compile(ParseEbnf("root ::= \"(\" root \")\" | \"x\" | \"[\" root (\",\" root)* \"]\""), vocab)};
  // 48 matchers, 16 per grammar, each walked a different random number of tokens.
  std::vector<std::unique_ptr<GrammarMatcher>> matchers;
  std::mt19937 rng(3);
  for (int i = 0; i < 48; ++i) {
    auto m = std::make_unique<GrammarMatcher>(grammars[i % grammars.size()]);
    const int steps = static_cast<int>(rng() % 24);
    std::vector<uint32_t> mask(vocab->mask_words());
    for (int s = 0; s < steps; ++s) {
      std::fill(mask.begin(), mask.end(), 0u);
      m->FillNextTokenBitmask(mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        if (((mask[id >> 5] >> (id & 31)) & 1) && !vocab->is_end_token(id)) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      ASSERT_TRUE(m->AcceptToken(allowed[rng() % allowed.size()]));
    }
    matchers.push_back(std::move(m));
  }
  std::vector<std::vector<uint32_t>> serial(matchers.size(), std::vector<uint32_t>(vocab->mask_words()));
  for (size_t i = 0; i < matchers.size(); ++i) matchers[i]->FillNextTokenBitmask(serial[i]);
  cpu::ThreadPool pool(4);
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<uint32_t>> parallel(matchers.size(), std::vector<uint32_t>(vocab->mask_words()));
    pool.ParallelFor(static_cast<int64_t>(matchers.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) matchers[i]->FillNextTokenBitmask(parallel[i]);
    });
    for (size_t i = 0; i < matchers.size(); ++i) EXPECT_EQ(parallel[i], serial[i]) << "matcher " << i;
  }
}

}  // namespace
}  // namespace tandem::grammar
