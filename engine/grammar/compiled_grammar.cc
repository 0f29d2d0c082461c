#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/earley_recognizer.h"
#include "engine/grammar/token_walker.h"
#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {

// Longest chain of single sites followed (rule_table.h); beyond it the outer rule's
// completion is an exit like any other. Deep chains come from long bounded
// repetitions, where no token crosses that many completions anyway.
constexpr size_t kMaxChain = 128;

}  // namespace

TokenSet TokenSet::FromIds(std::vector<int32_t> ids, size_t vocab_size) {
  TokenSet s;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (ids.size() * 32 < vocab_size) {
    s.ids = std::move(ids);
    return s;
  }
  s.bits.assign((vocab_size + 31) / 32, 0);
  for (int32_t id : ids) s.bits[id >> 5] |= uint32_t{1} << (id & 31);
  return s;
}

void TokenSet::OrInto(std::span<uint32_t> mask) const {
  if (!bits.empty()) {
    const size_t n = std::min(mask.size(), bits.size());
    uint32_t* __restrict out = mask.data();
    const uint32_t* __restrict in = bits.data();
    for (size_t i = 0; i < n; ++i) out[i] |= in[i];
    return;
  }
  for (int32_t id : ids) mask[id >> 5] |= uint32_t{1} << (id & 31);
}

namespace {

class Precomputer {
 public:
  Precomputer(const RuleTable& table, const GrammarVocabulary& vocab, absl::Time deadline)
      : table_(table), vocab_(vocab), deadline_(deadline), rec_(table), any_context_(table),
        walker_(vocab, &rec_, deadline),
        any_walker_(vocab, &any_context_, deadline) {
    // Every site of every rule, from set 0: completions with origin 0 reach them all.
    std::vector<EarleyRecognizer::Item> sites;
    for (int32_t p = 0; p < static_cast<int32_t>(table_.num_positions()); ++p) {
      if (table_.kind(p) == RuleTable::kRule && table_.rule_of(p) >= 0) sites.push_back({p, 0});
    }
    any_context_.StartSet(sites);
  }

  uint64_t pushes() const { return walker_.pushes() + any_walker_.pushes(); }
  size_t shared_walks() const { return level1_.size(); }
  size_t pruned() const { return pruned_; }

  // Fills entries for every position an item can hold after input.
  absl::Status Run(std::vector<int32_t>* entry_of, std::vector<CompiledGrammar::Entry>* entries,
                   std::vector<TokenSet>* bases) {
    entry_of->assign(table_.num_positions(), -1);
    bases_ = bases;
    // The start: the whole grammar, nothing uncertain.
    {
      rec_.ResetToStart();
      std::vector<int32_t> accepted;
      std::vector<UncertainSubtree> uncertain;
      const int32_t root = 0;
      if (absl::Status s = walker_.Walk({&root, 1}, &accepted, &uncertain); !s.ok()) return s;
      TANDEM_CHECK(uncertain.empty());
      CompiledGrammar::Entry e;
      e.base = AddBase(std::move(accepted));
      (*entry_of)[table_.start_position()] = static_cast<int32_t>(entries->size());
      entries->push_back(std::move(e));
    }
    for (int32_t p = 0; p < static_cast<int32_t>(table_.num_positions()); ++p) {
      const RuleTable::Kind k = table_.kind(p);
      if ((k != RuleTable::kTerminal && k != RuleTable::kRule) || table_.rule_of(p) < 0 || table_.dot(p) == 0) {
        continue;
      }
      // The walks check the deadline as they go; this catches grammars of many small
      // entries too.
      if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) {
        return absl::DeadlineExceededError("precomputation passed its deadline");
      }
      absl::StatusOr<CompiledGrammar::Entry> e = EntryFor(p);
      if (!e.ok()) return e.status();
      (*entry_of)[p] = static_cast<int32_t>(entries->size());
      entries->push_back(*std::move(e));
    }
    return absl::OkStatus();
  }

 private:
  struct Level1 {
    int32_t base;
    std::vector<int32_t> candidates;  // trie nodes, ascending
  };

  int32_t AddBase(std::vector<int32_t> ids) {
    bases_->push_back(TokenSet::FromIds(std::move(ids), static_cast<size_t>(vocab_.size())));
    return static_cast<int32_t>(bases_->size() - 1);
  }

  // Step 1: within p's rule alone, shared by identical rule bodies.
  absl::StatusOr<const Level1*> Level1For(int32_t p) {
    const int32_t rule = table_.rule_of(p);
    const uint64_t key = (static_cast<uint64_t>(table_.canonical_rule(rule)) << 32) |
                         static_cast<uint32_t>(p - table_.alternatives(rule)[0]);
    if (auto it = level1_.find(key); it != level1_.end()) return &it->second;
    rec_.Clear();
    const EarleyRecognizer::Item below{table_.exit_wait(rule), 0};
    rec_.StartSet({&below, 1});
    const EarleyRecognizer::Item at{p, 0};
    rec_.StartSet({&at, 1});
    std::vector<int32_t> accepted;
    std::vector<UncertainSubtree> uncertain;
    const int32_t root = 0;
    if (absl::Status s = walker_.Walk({&root, 1}, &accepted, &uncertain); !s.ok()) return s;
    Level1 l{AddBase(std::move(accepted)), {}};
    for (const UncertainSubtree& u : uncertain) l.candidates.push_back(u.node);
    return &level1_.emplace(key, std::move(l)).first->second;
  }

  absl::StatusOr<CompiledGrammar::Entry> EntryFor(int32_t p) {
    absl::StatusOr<const Level1*> l1 = Level1For(p);
    if (!l1.ok()) return l1.status();
    CompiledGrammar::Entry e;
    e.base = (*l1)->base;
    if ((*l1)->candidates.empty()) return e;
    // Step 2: the chain of single sites under p's rule.
    int32_t outer = table_.rule_of(p);
    while (outer != table_.start_rule() && table_.sites(outer).size() == 1 && e.chain.size() < kMaxChain) {
      const int32_t site = table_.sites(outer)[0];
      e.chain.push_back(site);
      outer = table_.rule_of(site);
    }
    // Sets: 0 the outer rule predicted (under an exit marker unless it is $start), then
    // one set per site from the outside in, then p.
    rec_.Clear();
    const EarleyRecognizer::Item bottom =
        outer == table_.start_rule() ? EarleyRecognizer::Item{table_.start_position(), 0}
                                     : EarleyRecognizer::Item{table_.exit_wait(outer), 0};
    rec_.StartSet({&bottom, 1});
    for (size_t j = 0; j < e.chain.size(); ++j) {
      const EarleyRecognizer::Item site{e.chain[e.chain.size() - 1 - j], static_cast<int32_t>(j)};
      rec_.StartSet({&site, 1});
    }
    const EarleyRecognizer::Item at{p, static_cast<int32_t>(e.chain.size())};
    rec_.StartSet({&at, 1});
    std::vector<int32_t> accepted;
    std::vector<UncertainSubtree> uncertain;
    if (absl::Status s = walker_.Walk((*l1)->candidates, &accepted, &uncertain); !s.ok()) return s;
    e.extra = TokenSet::FromIds(std::move(accepted), static_cast<size_t>(vocab_.size()));
    if (uncertain.empty()) {
      e.chain.clear();
      return e;
    }
    TANDEM_CHECK(outer != table_.start_rule());
    e.outer = outer;
    // Keep the suffixes some context could consume after `outer` completes.
    any_context_.PopTo(1);
    const EarleyRecognizer::Item completed{table_.end_position(outer), 0};
    any_context_.StartSet({&completed, 1});
    const auto& trie = vocab_.trie();
    std::vector<int32_t> kept;
    for (const UncertainSubtree& u : uncertain) {
      for (int32_t d : u.exit_depths) {
        kept.clear();
        if (absl::Status s = any_walker_.WalkShifted(u.node, d, &kept); !s.ok()) return s;
        pruned_ += static_cast<size_t>(trie[u.node].tok_sub_end - trie[u.node].tok_begin) - kept.size();
        for (int32_t id : kept) e.uncertain.push_back({id, d});
      }
    }
    TokenWalker::SortSuffixes(vocab_, &e.uncertain);
    if (e.uncertain.empty()) e.chain.clear(), e.outer = -1;
    return e;
  }

  const RuleTable& table_;
  const GrammarVocabulary& vocab_;
  absl::Time deadline_;
  EarleyRecognizer rec_;
  EarleyRecognizer any_context_;
  TokenWalker walker_;
  TokenWalker any_walker_;
  std::vector<TokenSet>* bases_ = nullptr;
  absl::flat_hash_map<uint64_t, Level1> level1_;
  size_t pruned_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const GrammarVocabulary> vocabulary, const CompileOptions& options) {
  const absl::Time started = absl::Now();
  auto g = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  g->vocab_ = std::move(vocabulary);
  g->table_ = RuleTable::Build(grammar, options.table);
  Precomputer pre(g->table_, *g->vocab_, options.deadline);
  if (absl::Status s = pre.Run(&g->entry_of_, &g->entries_, &g->bases_); !s.ok()) {
    if (absl::IsDeadlineExceeded(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: the grammar took longer to compile than its limit (after ",
                       absl::FormatDuration(absl::Now() - started), ")"));
    }
    return s;
  }
  Stats& st = g->stats_;
  st.positions = g->table_.num_positions();
  st.entries = g->entries_.size();
  st.shared_walks = pre.shared_walks();
  st.copies = g->table_.num_copies();
  st.pushes = pre.pushes();
  st.pruned = pre.pruned();
  for (const TokenSet& b : g->bases_) st.mask_bytes += b.bytes();
  for (const Entry& e : g->entries_) {
    st.uncertain += e.uncertain.size();
    st.mask_bytes += e.extra.bytes() + e.uncertain.size() * sizeof(TokenSuffix) + e.chain.size() * sizeof(int32_t);
  }
  st.compile_time = absl::Now() - started;
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

}  // namespace tandem::grammar
