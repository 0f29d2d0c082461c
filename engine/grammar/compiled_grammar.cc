#include "engine/grammar/compiled_grammar.h"

#include <algorithm>
#include <deque>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/counted_repetition.h"
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
  Precomputer(const RuleTable& table, const GrammarVocabulary& vocab, absl::Time deadline, bool stack_walker,
              bool counted_repetitions, int64_t horizon)
      : table_(table), vocab_(vocab), deadline_(deadline), rec_(table), any_context_(table),
        walker_(vocab, &rec_, deadline), any_walker_(vocab, &any_context_, deadline), machine_(table),
        stack_walker_(vocab, &machine_, deadline), use_stack_(stack_walker), token_stamp_(vocab.size(), 0) {
    horizon_ = horizon;
    if (counted_repetitions) {
      counted_ = std::make_unique<CountedRepetitions>(table, vocab, &machine_, &stack_walker_, horizon, deadline);
    }
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
  size_t derived() const { return counted_ ? counted_->derived() : 0; }
  size_t derived_groups() const { return counted_ ? counted_->derived_groups() : 0; }

  // Fills entries for every position an item can hold after input.
  absl::Status Run(std::vector<int32_t>* entry_of, std::vector<CompiledGrammar::Entry>* entries,
                   std::vector<TokenSet>* bases) {
    entry_of->assign(table_.num_positions(), -1);
    bases_ = bases;
    // The start: the whole grammar, nothing uncertain.
    {
      std::vector<int32_t> accepted;
      std::vector<Pending> uncertain;
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
  using Pending = UncertainSubtree;
  struct Level1 {
    int32_t id;
    int32_t base;
    std::vector<Pending> candidates;  // where the rule completed, in trie order
    // The candidates by the byte that follows their exit (built on first use).
    std::vector<std::vector<Pending>> by_next_byte;
    int64_t reach = -1;  // the most bytes of a candidate past its exit (-1: not known yet)
  };

  // The most bytes a candidate of `l1` has past its exit, hence the most copies of a
  // repeated element (at least a byte each) it can cross in step 2.
  int64_t Reach(Level1* l1) {
    if (l1->reach >= 0) return l1->reach;
    const auto& trie = vocab_.trie();
    l1->reach = 0;
    for (const Pending& c : l1->candidates) l1->reach = std::max<int64_t>(l1->reach, trie[c.node].deepest - c.depth);
    return l1->reach;
  }
  using Shifted = CountedRepetitions::Outcome;

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
  // What an item at p can do within one token depends only on the symbols from p on
  // until they need more bytes than the longest token (the horizon), and, if the end of
  // p's alternative lies within that, on p's rule itself (its completion, its other
  // alternatives when it recurses on itself). The key says exactly that, with rules by
  // canonical number; positions with equal keys share step 1 (a string's hundred
  // required characters are one walk, not a hundred).
  std::string RemainderKey(int32_t p, bool* end_reachable) {
    std::string key;
    int64_t need = 0;
    int32_t q = p;
    for (; table_.kind(q) != RuleTable::kEnd && need <= horizon_; ++q) {
      if (table_.kind(q) == RuleTable::kTerminal) {
        absl::StrAppend(&key, "t", table_.arg(q), " ");
        need += 1;
      } else {
        absl::StrAppend(&key, "r", table_.canonical_rule(table_.arg(q)), " ");
        need += MinLength(table_.arg(q));
      }
    }
    *end_reachable = table_.kind(q) == RuleTable::kEnd && need <= horizon_;
    if (*end_reachable) {
      const int32_t rule = table_.rule_of(p);
      absl::StrAppend(&key, "| ", table_.canonical_rule(rule), "@", p - table_.alternatives(rule)[0]);
    }
    return key;
  }

  // The least number of bytes a rule matches (a fixpoint, computed once).
  int64_t MinLength(int32_t rule) {
    if (min_length_.empty()) {
      constexpr int64_t kInf = int64_t{1} << 40;
      min_length_.assign(table_.num_rules(), kInf);
      for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < static_cast<int32_t>(table_.num_rules()); ++r) {
          for (int32_t a : table_.alternatives(r)) {
            int64_t n = 0;
            for (int32_t q = a; table_.kind(q) != RuleTable::kEnd && n < kInf; ++q) {
              n += table_.kind(q) == RuleTable::kTerminal ? 1 : min_length_[table_.arg(q)];
            }
            if (n < min_length_[r]) {
              min_length_[r] = std::min(n, kInf);
              changed = true;
            }
          }
        }
      }
    }
    return min_length_[rule];
  }

  absl::StatusOr<Level1*> Level1For(int32_t p) {
    bool end_reachable = false;
    std::string key = RemainderKey(p, &end_reachable);
    if (auto it = level1_.find(key); it != level1_.end()) return &it->second;
    std::vector<int32_t> accepted;
    std::vector<Pending> uncertain;
    bool derived = false;
    if (use_stack_ && counted_) {
      // A counted repetition's positions: from shared per-token figures, not a walk each.
      absl::StatusOr<bool> d = counted_->Derive(p, &accepted, &uncertain);
      if (!d.ok() && !absl::IsFailedPrecondition(d.status())) return d.status();
      derived = d.ok() && *d;
      if (!derived) {
        accepted.clear();
        uncertain.clear();
      }
    }
    const int32_t root = 0;
    if (!derived) {
      if (absl::Status s = WalkFrom({&p, 1}, {&root, 1}, &accepted, &uncertain); !s.ok()) return s;
    }
    Level1 l{static_cast<int32_t>(level1_.size()), AddSet(std::move(accepted)), std::move(uncertain), {}, -1};
    return &level1_.emplace(std::move(key), std::move(l)).first->second;
  }

  absl::StatusOr<CompiledGrammar::Entry> EntryFor(int32_t p) {
    absl::StatusOr<Level1*> l1 = Level1For(p);
    if (!l1.ok()) return l1.status();
    CompiledGrammar::Entry e;
    e.base = (*l1)->base;
    if ((*l1)->candidates.empty()) return e;
    // Step 2: through the chain of single sites under p's rule.
    std::vector<int32_t> accepted;
    std::vector<Pending> uncertain;
    int32_t outer = -1;
    std::string key;
    const CompiledGrammar::Entry* same = nullptr;
    if (absl::Status s = ThroughChain(p, *l1, &accepted, &uncertain, &outer, &key, &same); !s.ok()) return s;
    if (same != nullptr) return *same;
    absl::StatusOr<CompiledGrammar::Entry> done = Finish(std::move(e), std::move(accepted), std::move(uncertain), outer);
    if (done.ok() && !key.empty()) entry_memo_.emplace(std::move(key), *done);
    return done;
  }

  // An entry from step 2's outcome: the sets stored, the uncertain suffixes pruned.
  absl::StatusOr<CompiledGrammar::Entry> Finish(CompiledGrammar::Entry e, std::vector<int32_t> accepted,
                                                std::vector<Pending> uncertain, int32_t outer) {
    if (!accepted.empty()) e.extra = AddSet(std::move(accepted));
    if (uncertain.empty()) return e;
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
    for (const auto& [node, d] : uncertain) {  // sorted: equal subtrees share walks

      kept.clear();
      if (absl::Status s = any_walker_.WalkShifted(node, d, &kept); !s.ok()) return s;
      pruned_ += static_cast<size_t>(trie[node].tok_sub_end - trie[node].tok_begin) - kept.size();
      for (int32_t id : kept) e.uncertain.push_back({id, d});
    }
    TokenWalker::SortSuffixes(vocab_, &e.uncertain);
    if (e.uncertain.empty()) e.outer = -1;
    return e;
  }

  // Step 2 for the candidates of step 1. A candidate died inside p's rule after that
  // rule completed at the recorded depths; in the chain it can only go on from there,
  // after the innermost site, and that state is the same for every candidate (and for
  // every position whose rule completes into the same state: memoized). With the
  // Earley walker, the candidates are walked again from a chart of the whole chain.
  // The chain is taken kSegment sites at a time: a segment's stack is rebuilt from
  // canonical representatives (the outermost site's rule replaced by the first rule of
  // its canonical class, the others by the rules that one references), so identical
  // copies of a rule share one machine state and one memo; the tokens that complete a
  // segment's outermost rule go on to the next segment.
  static constexpr size_t kSegment = 4;

  // The sites above p's rule while each rule has exactly one (rule_table.h), innermost
  // first, up to $start, a rule of several sites, or kMaxChain kept sites; returns the
  // rule it stopped at (the outer rule: its completion is the exit). With `skip_tails`,
  // tail sites are left out: a rule completing there completes the site's rule at once
  // (what the stack machine's stacks may skip; bounded repetitions are chains of them).
  int32_t Chain(int32_t p, bool skip_tails, std::vector<int32_t>* chain) {
    chain->clear();
    int32_t rule = table_.rule_of(p);
    if (!skip_tails) {
      while (rule != table_.start_rule() && table_.sites(rule).size() == 1 && chain->size() < kMaxChain) {
        const int32_t site = table_.sites(rule)[0];
        chain->push_back(site);
        rule = table_.rule_of(site);
      }
      return rule;
    }
    while (chain->size() < kMaxChain) {
      const auto [site, stop] = Hop(rule);
      if (site < 0) {
        rule = stop;
        break;
      }
      chain->push_back(site);
      rule = table_.rule_of(site);
    }
    // Ending at $start, the stack must bottom out in it (its completion is the end of
    // the input, not an exit).
    if (rule == table_.start_rule() && !chain->empty() && table_.rule_of(chain->back()) != rule) {
      chain->push_back(table_.start_position());
    }
    return rule;
  }

  // From `rule` up through tail sites: the first site that is not a tail site, or -1
  // and the rule where the single sites end ($start, or a rule of several sites).
  // Memoized: a rule is passed once in all (a repetition's chain is walked once, not
  // once per position in it).
  std::pair<int32_t, int32_t> Hop(int32_t rule) {
    if (hop_.empty()) hop_.assign(table_.num_rules(), {-2, -1});
    std::vector<int32_t> passed;
    std::pair<int32_t, int32_t> result;
    for (;;) {
      if (hop_[rule].first != -2) {
        result = hop_[rule];
        break;
      }
      if (rule == table_.start_rule() || table_.sites(rule).size() != 1) {
        result = {-1, rule};
        break;
      }
      const int32_t site = table_.sites(rule)[0];
      if (!table_.is_tail_site(site)) {
        result = {site, -1};
        break;
      }
      passed.push_back(rule);
      rule = table_.rule_of(site);
    }
    hop_[rule] = result;
    for (int32_t r : passed) hop_[r] = result;
    return result;
  }

  // `key` and `same`: the entry memo's key, and its entry when it already holds it.
  absl::Status ThroughChain(int32_t p, Level1* l1, std::vector<int32_t>* accepted, std::vector<Pending>* uncertain,
                            int32_t* outer, std::string* key, const CompiledGrammar::Entry** same) {
    std::vector<int32_t> chain;
    *outer = Chain(p, use_stack_, &chain);
    if (chain.empty()) {
      // p's rule (or a rule it completes at once) is the outer one: its completion is
      // the exit, or, for $start, the end (nothing may follow: refused).
      if (*outer != table_.start_rule()) *uncertain = l1->candidates;
      return absl::OkStatus();
    }
    if (!use_stack_) {
      std::vector<int32_t> stack(chain.rbegin(), chain.rend());
      stack.push_back(p);
      return WalkFrom(stack, Nodes(l1->candidates), accepted, uncertain);
    }
    if (++stamp_ == 0) {
      std::fill(token_stamp_.begin(), token_stamp_.end(), 0);
      stamp_ = 1;
    }
    if (l1->by_next_byte.empty()) {
      l1->by_next_byte.resize(256);
      for (const Pending& c : l1->candidates) {
        l1->by_next_byte[static_cast<uint8_t>(vocab_.NodePath(c.node)[c.depth])].push_back(c);
      }
    }
    // Segment k covers chain[k * kSegment, ...); its state is where a token goes on
    // after the rule below the segment completed. A segment whose rule completes at
    // once passes a byte it refuses on to the next one.
    const size_t segments = (chain.size() + kSegment - 1) / kSegment;
    std::vector<StackMachine::State> state(segments, StackMachine::kDead);
    std::vector<char> built(segments, 0);
    // Positions with the same step 1, the same first segment's state and the same sites
    // above it get the same entry (the copies of a repeated rule away from the
    // repetition's bounds: thousands in a long bounded string), computed once. Off with
    // counted repetitions, so that the general path stays what it was.
    const std::vector<int32_t> stack0 = SegmentStack(chain, 0, std::min(chain.size(), kSegment));
    state[0] = machine_.Initial(stack0);
    built[0] = 1;
    if (counted_ && state[0] != StackMachine::kDead) {
      std::vector<int32_t> parts = {l1->id, state[0], *outer};
      // Inside a counted repetition, the copies near a bound have states of their own,
      // but step 1's candidates reach at most `Reach(l1)` copies past their exit: the
      // run's counts clipped there say all that the state does to them (exact).
      if (std::vector<int32_t> run; counted_->ClippedRun(stack0, Reach(l1) + 1, &run)) {
        parts[1] = -1;
        parts.insert(parts.end(), run.begin(), run.end());
      }
      parts.insert(parts.end(), chain.begin() + static_cast<std::ptrdiff_t>(std::min(chain.size(), kSegment)),
                   chain.end());
      key->assign(reinterpret_cast<const char*>(parts.data()), parts.size() * sizeof(int32_t));
      if (auto it = entry_memo_.find(*key); it != entry_memo_.end()) {
        *same = &it->second;
        return absl::OkStatus();
      }
    }
    const auto state_of = [&](size_t k) {
      if (!built[k]) {
        state[k] = SegmentState(chain, k * kSegment, std::min(chain.size(), (k + 1) * kSegment));
        built[k] = 1;
      }
      return state[k];
    };
    // The first segment from k on whose state takes byte b (passing through segments
    // that complete at once); `segments` when the last one completes at once and the
    // byte is left to run time; -1 when the byte dies.
    bool failed = false;
    const auto resolve = [&](size_t k, uint8_t b) -> int64_t {
      for (; k < segments; ++k) {
        const StackMachine::State st = state_of(k);
        if (st == StackMachine::kDead) {
          failed = true;
          return -1;
        }
        if (machine_.NextBytes(st).Contains(b)) return static_cast<int64_t>(k);
        if (!machine_.HasExit(st)) return -1;
      }
      return static_cast<int64_t>(segments);
    };
    std::vector<std::vector<Pending>> pending(segments + 1);
    const auto step = [&](size_t k, const Pending& c) -> absl::Status {
      const StackMachine::State after = state[k];
      const std::tuple<int32_t, int32_t, int32_t> key{after, c.node, c.depth};
      auto it = shifted_.find(key);
      if (it == shifted_.end()) {
        Shifted r;
        absl::Status status = stack_walker_.WalkShifted(after, c.node, c.depth, &r.accepted, &r.uncertain);
        if (!status.ok()) return status;
        it = shifted_.emplace(key, std::move(r)).first;
      }
      for (int32_t id : it->second.accepted) {
        if (token_stamp_[id] == stamp_) continue;
        token_stamp_[id] = stamp_;
        accepted->push_back(id);
      }
      pending[k + 1].insert(pending[k + 1].end(), it->second.uncertain.begin(), it->second.uncertain.end());
      return absl::OkStatus();
    };
    // A byte group's outcome from a segment state is the same for every position
    // sharing this step 1 result and state (copies of one rule): memoized whole.
    const auto merge = [&](size_t k, const Shifted& r) {
      for (int32_t id : r.accepted) {
        if (token_stamp_[id] == stamp_) continue;
        token_stamp_[id] = stamp_;
        accepted->push_back(id);
      }
      pending[k + 1].insert(pending[k + 1].end(), r.uncertain.begin(), r.uncertain.end());
    };
    absl::Status status = absl::OkStatus();
    for (int b = 0; b < 256 && status.ok(); ++b) {
      const std::vector<Pending>& group = l1->by_next_byte[b];
      if (group.empty()) continue;
      const int64_t k = resolve(0, static_cast<uint8_t>(b));
      if (failed) break;
      if (k < 0) continue;
      if (k == static_cast<int64_t>(segments)) {
        pending[segments].insert(pending[segments].end(), group.begin(), group.end());
        continue;
      }
      const std::tuple<int32_t, int32_t, int32_t> key{state[k], l1->id, b};
      auto it = group_memo_.find(key);
      if (it == group_memo_.end()) {
        const Shifted* found = nullptr;
        // Inside a counted repetition, the group's outcome from every copy's state comes
        // from one set of figures of its subtrees (counted_repetition.h).
        if (counted_ && k == 0) {
          absl::StatusOr<const Shifted*> d = counted_->DeriveShifted(stack0, int64_t{l1->id} * 256 + b, group);
          if (!d.ok() && !absl::IsFailedPrecondition(d.status())) {
            status = d.status();
            break;
          }
          if (d.ok()) found = *d;
        }
        if (found == nullptr) {
          Shifted& all = walked_groups_.emplace_back();
          for (const Pending& c : group) {
            Shifted r;
            status = stack_walker_.WalkShifted(state[k], c.node, c.depth, &r.accepted, &r.uncertain);
            if (!status.ok()) break;
            all.accepted.insert(all.accepted.end(), r.accepted.begin(), r.accepted.end());
            all.uncertain.insert(all.uncertain.end(), r.uncertain.begin(), r.uncertain.end());
          }
          if (!status.ok()) break;
          std::sort(all.accepted.begin(), all.accepted.end());
          all.accepted.erase(std::unique(all.accepted.begin(), all.accepted.end()), all.accepted.end());
          found = &all;
        }
        it = group_memo_.emplace(key, found).first;
      }
      merge(static_cast<size_t>(k), *it->second);
    }
    for (size_t from = 1; from < segments && status.ok() && !failed; ++from) {
      std::vector<Pending>& list = pending[from];
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
      for (const Pending& c : list) {
        const int64_t k = resolve(from, static_cast<uint8_t>(vocab_.NodePath(c.node)[c.depth]));
        if (failed) break;
        if (k < 0) continue;
        if (k == static_cast<int64_t>(segments)) {
          pending[segments].push_back(c);
          continue;
        }
        status = step(static_cast<size_t>(k), c);
        if (!status.ok()) break;
      }
      list.clear();
    }
    if (failed || absl::IsFailedPrecondition(status)) return FallBack(p, l1->candidates, accepted, uncertain, outer);
    if (!status.ok()) return status;
    *uncertain = std::move(pending[segments]);
    return absl::OkStatus();
  }

  // The machine state after the rule below chain[level] completed, with the sites
  // chain[level, end) above it: built from canonical representatives (see kSegment).
  StackMachine::State SegmentState(const std::vector<int32_t>& chain, size_t level, size_t end) {
    return machine_.Initial(SegmentStack(chain, level, end));
  }
  std::vector<int32_t> SegmentStack(const std::vector<int32_t>& chain, size_t level, size_t end) {
    std::vector<int32_t> stack;
    for (size_t j = end; j > level; --j) {
      // Each site at the same offset of its rule's representative: rules of one
      // canonical class behave alike, so the machine pops a completed rule into any
      // site of its class (and through skipped tail sites) alike.
      const int32_t site = chain[j - 1];
      const int32_t rule = table_.rule_of(site);
      stack.push_back(table_.alternatives(Representative(rule))[0] + (site - table_.alternatives(rule)[0]));
    }
    stack.back() += 1;  // past the innermost site: the rule below it has completed
    // When what the innermost position still needs exceeds the horizon, nothing below
    // it can matter to a token: its first position of equal remainder alone stands for
    // the whole stack (so states beyond the horizon are shared).
    bool end_reachable = false;
    std::string key = RemainderKey(stack.back(), &end_reachable);
    if (!end_reachable) {
      auto [it, inserted] = horizon_representative_.try_emplace(std::move(key), stack.back());
      stack.assign(1, it->second);
    }
    return stack;
  }

  int32_t Representative(int32_t rule) {
    if (representative_.empty()) {
      representative_.assign(table_.num_canonical_rules(), -1);
      for (int32_t r = 0; r < static_cast<int32_t>(table_.num_rules()); ++r) {
        int32_t& rep = representative_[table_.canonical_rule(r)];
        if (rep < 0) rep = r;
      }
    }
    return representative_[table_.canonical_rule(rule)];
  }

  static std::vector<int32_t> Nodes(const std::vector<Pending>& pending) {
    std::vector<int32_t> nodes;
    for (const Pending& c : pending) {
      if (nodes.empty() || nodes.back() != c.node) nodes.push_back(c.node);
    }
    return nodes;
  }

  // ThroughChain with the Earley walker, after the stack machine gave up (for the rest
  // of the grammar). `stack` is the chain with its innermost site advanced.
  absl::Status FallBack(int32_t p, const std::vector<Pending>& candidates, std::vector<int32_t>* accepted,
                        std::vector<Pending>* uncertain, int32_t* outer) {
    use_stack_ = false;
    accepted->clear();
    uncertain->clear();
    std::vector<int32_t> chain;
    *outer = Chain(p, /*skip_tails=*/false, &chain);
    if (chain.empty()) {
      if (*outer != table_.start_rule()) *uncertain = candidates;
      return absl::OkStatus();
    }
    std::vector<int32_t> stack(chain.rbegin(), chain.rend());
    stack.push_back(p);
    return WalkFrom(stack, Nodes(candidates), accepted, uncertain);
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
  std::unique_ptr<CountedRepetitions> counted_;  // null when CompileOptions turns it off
  std::vector<TokenSet>* bases_ = nullptr;
  absl::node_hash_map<std::string, Level1> level1_;  // node: entries keep pointers
  absl::flat_hash_map<std::string, int32_t> horizon_representative_;  // RemainderKey -> first position
  std::vector<int64_t> min_length_;
  int64_t horizon_ = 0;
  absl::flat_hash_map<std::string, int32_t> set_index_;
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, Shifted> shifted_;
  // (state, step 1 result, byte) -> outcome: walked (in walked_groups_) or derived.
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, const Shifted*> group_memo_;
  std::deque<Shifted> walked_groups_;
  absl::flat_hash_map<std::string, CompiledGrammar::Entry> entry_memo_;  // ThroughChain's key
  std::vector<int32_t> representative_;  // per canonical rule: its first rule
  std::vector<std::pair<int32_t, int32_t>> hop_;  // per rule: Hop's answer ({-2, -1} until known)
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
  // A token the vocabulary lacks would leave its alternatives silently unmatchable.
  for (const std::string& name : grammar.token_names()) {
    const std::optional<int32_t> id = g->vocab_->SpecialTokenId(name);
    if (!id) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: token '", name,
                                                     "' is not a special or added token of this vocabulary"));
    }
    if (g->vocab_->is_end_token(*id)) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: token '", name, "' (id ", *id,
                                                     ") ends generation: it is allowed where the grammar may end, "
                                                     "and a grammar does not name it"));
    }
  }
  RuleTableOptions table_options = options.table;
  if (table_options.repeat_horizon == 0) {
    for (int32_t id = 0; id < g->vocab_->size(); ++id) {
      if (!g->vocab_->matchable(id)) continue;
      table_options.repeat_horizon =
          std::max(table_options.repeat_horizon, static_cast<int32_t>(g->vocab_->token_bytes(id).size()));
    }
  }
  g->table_ = RuleTable::Build(grammar, table_options);
  Precomputer pre(g->table_, *g->vocab_, options.deadline, options.stack_walker, options.counted_repetitions,
                  table_options.repeat_horizon);
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
  st.derived = pre.derived();
  st.derived_groups = pre.derived_groups();
  st.copies = g->table_.num_copies();
  st.pushes = pre.pushes();
  st.pruned = pre.pruned();
  st.machine_states = pre.machine_states();
  st.stack_walker = pre.used_stack_machine();
  for (const TokenSet& b : g->sets_) st.mask_bytes += b.bytes();
  for (const Entry& e : g->entries_) {
    st.uncertain += e.uncertain.size();
    st.mask_bytes += sizeof(Entry) + e.uncertain.size() * sizeof(TokenSuffix);
  }
  st.compile_time = absl::Now() - started;
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

}  // namespace tandem::grammar
