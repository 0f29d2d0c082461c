#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/earley_recognizer.h"
#include "engine/grammar/stack_walker.h"
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
  if (ids.size() * 32 >= vocab_size) {  // dense (duplicates only make it denser)
    s.bits.assign((vocab_size + 31) / 32, 0);
    for (int32_t id : ids) s.bits[id >> 5] |= uint32_t{1} << (id & 31);
    return s;
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  s.ids = std::move(ids);
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
  Precomputer(const RuleTable& table, const GrammarVocabulary& vocab, absl::Time deadline, bool stack_walker)
      : table_(table), vocab_(vocab), deadline_(deadline), rec_(table), any_context_(table),
        walker_(vocab, &rec_, deadline), any_walker_(vocab, &any_context_, deadline), machine_(table),
        stack_walker_(vocab, &machine_, deadline), use_stack_(stack_walker), token_stamp_(vocab.size(), 0) {
    // Every site of every rule, from set 0: completions with origin 0 reach them all.
    std::vector<EarleyRecognizer::Item> sites;
    for (int32_t p = 0; p < static_cast<int32_t>(table_.num_positions()); ++p) {
      if (table_.kind(p) == RuleTable::kRule && table_.rule_of(p) >= 0) sites.push_back({p, 0});
    }
    any_context_.StartSet(sites);
  }

  uint64_t pushes() const { return walker_.pushes() + any_walker_.pushes() + stack_walker_.steps(); }
  size_t machine_states() const { return machine_.num_states(); }
  bool used_stack_machine() const { return use_stack_; }
  size_t shared_walks() const { return level1_.size(); }
  size_t pruned() const { return pruned_; }

  // Fills entries for every position an item can hold after input.
  absl::Status Run(std::vector<int32_t>* entry_of, std::vector<CompiledGrammar::Entry>* entries,
                   std::vector<TokenSet>* bases) {
    entry_of->assign(table_.num_positions(), -1);
    bases_ = bases;
    // The start: the whole grammar, nothing uncertain.
    {
      std::vector<int32_t> accepted;
      std::vector<UncertainSubtree> uncertain;
      const int32_t root = 0;
      const int32_t start = table_.start_position();
      if (absl::Status s = WalkFrom({&start, 1}, {&root, 1}, &accepted, &uncertain); !s.ok()) return s;
      TANDEM_CHECK(uncertain.empty());
      CompiledGrammar::Entry e;
      e.base = AddSet(std::move(accepted));
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
    std::vector<UncertainSubtree> candidates;  // ascending nodes, with the depths where the rule completed
  };
  // (trie node, depth at which the outer rule completed): a subtree left to run time.
  using Pending = std::pair<int32_t, int32_t>;
  struct Shifted {
    std::vector<int32_t> accepted;
    std::vector<Pending> uncertain;
  };

  static void Flatten(const std::vector<UncertainSubtree>& in, std::vector<Pending>* out) {
    for (const UncertainSubtree& u : in) {
      for (int32_t d : u.exit_depths) out->push_back({u.node, d});
    }
  }

  // The index of the set of `ids`, each distinct set stored once.
  int32_t AddSet(std::vector<int32_t> ids) {
    TokenSet set = TokenSet::FromIds(std::move(ids), static_cast<size_t>(vocab_.size()));
    std::string key(set.bits.empty() ? "i" : "b");
    const auto append = [&](const auto& v) {
      key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
    };
    if (set.bits.empty()) {
      append(set.ids);
    } else {
      append(set.bits);
    }
    auto [it, inserted] = set_index_.try_emplace(std::move(key), static_cast<int32_t>(bases_->size()));
    if (inserted) bases_->push_back(std::move(set));
    return it->second;
  }

  // Step 1: within p's rule alone, shared by identical rule bodies.
  absl::StatusOr<const Level1*> Level1For(int32_t p) {
    const int32_t rule = table_.rule_of(p);
    const uint64_t key = (static_cast<uint64_t>(table_.canonical_rule(rule)) << 32) |
                         static_cast<uint32_t>(p - table_.alternatives(rule)[0]);
    if (auto it = level1_.find(key); it != level1_.end()) return &it->second;
    std::vector<int32_t> accepted;
    std::vector<UncertainSubtree> uncertain;
    const int32_t root = 0;
    if (absl::Status s = WalkFrom({&p, 1}, {&root, 1}, &accepted, &uncertain); !s.ok()) return s;
    Level1 l{AddSet(std::move(accepted)), std::move(uncertain)};
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
    std::vector<int32_t> accepted;
    std::vector<Pending> uncertain;
    if (e.chain.empty()) {
      // p's rule is the outer one: its completion is the exit.
      Flatten((*l1)->candidates, &uncertain);
    } else if (absl::Status s = ThroughChain(p, e.chain, (*l1)->candidates, &accepted, &uncertain);
               !s.ok()) {
      return s;
    }
    if (!accepted.empty()) e.extra = AddSet(std::move(accepted));
    if (uncertain.empty()) {
      e.chain.clear();
      return e;
    }
    std::sort(uncertain.begin(), uncertain.end());
    uncertain.erase(std::unique(uncertain.begin(), uncertain.end()), uncertain.end());
    TANDEM_CHECK(outer != table_.start_rule());
    e.outer = outer;
    // Keep the suffixes some context could consume after `outer` completes.
    any_context_.PopTo(1);
    const EarleyRecognizer::Item completed{table_.end_position(outer), 0};
    any_context_.StartSet({&completed, 1});
    const auto& trie = vocab_.trie();
    std::vector<int32_t> kept;
    for (const auto& [node, d] : uncertain) {
      kept.clear();
      if (absl::Status s = any_walker_.WalkShifted(node, d, &kept); !s.ok()) return s;
      pruned_ += static_cast<size_t>(trie[node].tok_sub_end - trie[node].tok_begin) - kept.size();
      for (int32_t id : kept) e.uncertain.push_back({id, d});
    }
    TokenWalker::SortSuffixes(vocab_, &e.uncertain);
    if (e.uncertain.empty()) e.chain.clear(), e.outer = -1;
    return e;
  }

  // Step 2 for the candidates of step 1. A candidate died inside p's rule after that
  // rule completed at the recorded depths; in the chain it can only go on from there,
  // after the innermost site, and that state is the same for every candidate (and for
  // every position whose rule completes into the same state: memoized). With the
  // Earley walker, the candidates are walked again from a chart of the whole chain.
  absl::Status ThroughChain(int32_t p, const std::vector<int32_t>& chain,
                            const std::vector<UncertainSubtree>& candidates, std::vector<int32_t>* accepted,
                            std::vector<Pending>* uncertain) {
    std::vector<int32_t> stack(chain.rbegin(), chain.rend());
    if (use_stack_) {
      stack.back() += 1;  // past the innermost site: p's rule has completed
      const StackMachine::State after = machine_.Initial(stack);
      if (++stamp_ == 0) {
        std::fill(token_stamp_.begin(), token_stamp_.end(), 0);
        stamp_ = 1;
      }
      if (after == StackMachine::kDead) return FallBack(p, std::move(stack), candidates, accepted, uncertain);
      // Most candidates die on their first byte after the exit (a bounded string's
      // content tokens that are too long, say): one bit test, no walk.
      const ByteSet first = machine_.NextBytes(after);
      const bool exits_at_once = machine_.HasExit(after);
      absl::Status status = absl::OkStatus();
      for (const UncertainSubtree& u : candidates) {
        const std::string_view path = vocab_.NodePath(u.node);
        for (int32_t d : u.exit_depths) {
          if (!first.Contains(static_cast<uint8_t>(path[d]))) {
            if (exits_at_once) uncertain->push_back({u.node, d});
            continue;
          }
          const std::tuple<int32_t, int32_t, int32_t> key{after, u.node, d};
          auto it = shifted_.find(key);
          if (it == shifted_.end()) {
            std::vector<UncertainSubtree> left;
            Shifted r;
            status = stack_walker_.WalkShifted(after, u.node, d, &r.accepted, &left);
            if (!status.ok()) break;
            Flatten(left, &r.uncertain);
            it = shifted_.emplace(key, std::move(r)).first;
          }
          for (int32_t id : it->second.accepted) {
            if (token_stamp_[id] == stamp_) continue;
            token_stamp_[id] = stamp_;
            accepted->push_back(id);
          }
          uncertain->insert(uncertain->end(), it->second.uncertain.begin(), it->second.uncertain.end());
        }
        if (!status.ok()) break;
      }
      if (!absl::IsFailedPrecondition(status)) return status;
      return FallBack(p, std::move(stack), candidates, accepted, uncertain);
    }
    stack.push_back(p);
    std::vector<int32_t> nodes;
    for (const UncertainSubtree& u : candidates) nodes.push_back(u.node);
    std::vector<UncertainSubtree> left;
    absl::Status s = WalkFrom(stack, nodes, accepted, &left);
    Flatten(left, uncertain);
    return s;
  }

  // ThroughChain with the Earley walker, after the stack machine gave up (for the rest
  // of the grammar). `stack` is the chain with its innermost site advanced.
  absl::Status FallBack(int32_t p, std::vector<int32_t> stack, const std::vector<UncertainSubtree>& candidates,
                        std::vector<int32_t>* accepted, std::vector<Pending>* uncertain) {
    use_stack_ = false;
    accepted->clear();
    uncertain->clear();
    stack.back() -= 1;
    stack.push_back(p);
    std::vector<int32_t> nodes;
    for (const UncertainSubtree& u : candidates) nodes.push_back(u.node);
    std::vector<UncertainSubtree> left;
    absl::Status s = WalkFrom(stack, nodes, accepted, &left);
    Flatten(left, uncertain);
    return s;
  }

  // Walks `nodes` from the parse of one stack of positions (outermost first: sites, then
  // the position; completing the outermost rule is an exit unless it is $start). With
  // the stack machine when it can run the grammar, else with an Earley chart built to
  // the same effect: set 0 the outer rule predicted under an exit marker (or $start's
  // start), one set per site, then the position.
  absl::Status WalkFrom(std::span<const int32_t> stack, std::span<const int32_t> nodes, std::vector<int32_t>* accepted,
                        std::vector<UncertainSubtree>* uncertain) {
    if (use_stack_) {
      const StackMachine::State start = machine_.Initial(stack);
      absl::Status s = stack_walker_.Walk(start, nodes, accepted, uncertain);
      if (!absl::IsFailedPrecondition(s)) return s;
      use_stack_ = false;  // for the rest of this grammar
      accepted->clear();
      uncertain->clear();
    }
    rec_.Clear();
    const int32_t outer = table_.rule_of(stack[0]);
    if (stack.size() == 1 && stack[0] == table_.start_position()) {
      rec_.ResetToStart();
    } else {
      const EarleyRecognizer::Item bottom =
          outer == table_.start_rule() ? EarleyRecognizer::Item{table_.start_position(), 0}
                                       : EarleyRecognizer::Item{table_.exit_wait(outer), 0};
      rec_.StartSet({&bottom, 1});
      for (size_t j = 0; j < stack.size(); ++j) {
        const EarleyRecognizer::Item item{stack[j], static_cast<int32_t>(j)};
        rec_.StartSet({&item, 1});
      }
    }
    return walker_.Walk(nodes, accepted, uncertain);
  }

  const RuleTable& table_;
  const GrammarVocabulary& vocab_;
  absl::Time deadline_;
  EarleyRecognizer rec_;
  EarleyRecognizer any_context_;
  TokenWalker walker_;
  TokenWalker any_walker_;
  StackMachine machine_;
  StackTrieWalker stack_walker_;
  bool use_stack_;
  std::vector<TokenSet>* bases_ = nullptr;
  absl::flat_hash_map<uint64_t, Level1> level1_;
  absl::flat_hash_map<std::string, int32_t> set_index_;
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, Shifted> shifted_;
  std::vector<uint32_t> token_stamp_;  // per token: appended to the current entry's extra
  uint32_t stamp_ = 0;
  size_t pruned_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar, std::shared_ptr<const GrammarVocabulary> vocabulary, const CompileOptions& options) {
  const absl::Time started = absl::Now();
  auto g = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  g->vocab_ = std::move(vocabulary);
  g->table_ = RuleTable::Build(grammar, options.table);
  Precomputer pre(g->table_, *g->vocab_, options.deadline, options.stack_walker);
  if (absl::Status s = pre.Run(&g->entry_of_, &g->entries_, &g->sets_); !s.ok()) {
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
  st.machine_states = pre.machine_states();
  st.stack_walker = pre.used_stack_machine();
  for (const TokenSet& b : g->sets_) st.mask_bytes += b.bytes();
  for (const Entry& e : g->entries_) {
    st.uncertain += e.uncertain.size();
    st.mask_bytes += sizeof(Entry) + e.uncertain.size() * sizeof(TokenSuffix) + e.chain.size() * sizeof(int32_t);
  }
  st.compile_time = absl::Now() - started;
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

}  // namespace tandem::grammar
