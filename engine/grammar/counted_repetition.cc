#include "engine/grammar/counted_repetition.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

// Below this many copies a repetition's positions are few: walking them costs less than
// the figures' walk.
constexpr int64_t kMinCopies = 8;
constexpr uint32_t kNodesPerDeadlineCheck = 4096;

bool Intersect(const ByteSet& a, const ByteSet& b) {
  for (int i = 0; i < 4; ++i) {
    if (a.bits[i] & b.bits[i]) return true;
  }
  return false;
}

}  // namespace

// The trie walked with X repeated without bound. Copies' boundaries on the trie's paths
// form a tree (each boundary's parent is the previous one on its path, the root's depth
// 0 the first), so an event names its path's boundaries by the last one.
struct CountedRepetitions::Figures {
  struct Boundary {
    int32_t parent;
    int32_t count;  // whole copies up to it
    int32_t depth;
  };
  struct Event {
    int32_t node;   // the child the byte leads to
    int32_t bound;  // the last boundary above it
  };
  StackMachine::State start = StackMachine::kDead;  // X alone (rules only)
  ByteSet first;                                    // bytes that start a copy
  std::vector<Boundary> bounds;
  // Indexed by whole copies before the event (pure: by copies begun, the last one maybe
  // unfinished).
  std::vector<std::vector<int32_t>> pure;  // tokens made of copies of X
  std::vector<std::vector<Event>> stay;    // at a boundary, the byte starts another copy
  std::vector<std::vector<Event>> leave;   // at a boundary, the byte cannot start one
  std::vector<std::vector<Event>> die;     // inside a copy, the byte cannot continue it
};

CountedRepetitions::CountedRepetitions(const RuleTable& table, const GrammarVocabulary& vocabulary,
                                       StackMachine* machine, StackTrieWalker* walker, int64_t horizon,
                                       absl::Time deadline)
    : table_(table), vocab_(vocabulary), machine_(*machine), walker_(*walker), horizon_(horizon),
      deadline_(deadline) {}

CountedRepetitions::~CountedRepetitions() = default;

bool CountedRepetitions::Matches(int32_t pos, const Element& x) const {
  if (x.terminal) return table_.kind(pos) == RuleTable::kTerminal && table_.byte_set(pos) == x.set;
  return table_.kind(pos) == RuleTable::kRule && table_.canonical_rule(table_.arg(pos)) == x.canonical;
}

bool CountedRepetitions::ElementOf(int32_t pos, Element* x) const {
  const auto of = [&](int32_t q, Element* e) {
    if (table_.kind(q) == RuleTable::kTerminal) {
      e->terminal = true;
      e->set = table_.byte_set(q);
      return true;
    }
    if (table_.kind(q) != RuleTable::kRule) return false;
    e->terminal = false;
    e->rule = table_.arg(q);
    e->canonical = table_.canonical_rule(e->rule);
    return true;
  };
  if (!of(pos, x)) return false;
  if (x->terminal) return true;
  // A chain or star of some X is recognized by that X: the first symbol of its
  // non-empty alternative (after the self reference of a star).
  const int32_t r = x->rule;
  for (int32_t a : table_.alternatives(r)) {
    if (table_.kind(a) == RuleTable::kEnd) continue;
    const int32_t q = table_.kind(a) == RuleTable::kRule && table_.arg(a) == r ? a + 1 : a;
    Element inner;
    bool plus = false;
    if (of(q, &inner) && OptionalCopies(r, inner, &plus) >= 0) *x = inner;
    break;
  }
  return true;
}

int64_t CountedRepetitions::OptionalCopies(int32_t rule, const Element& x, bool* plus) const {
  using K = RuleTable::Kind;
  const int64_t cap = horizon_ + 1;
  const auto& alts = table_.alternatives(rule);
  if (alts.size() != 2) return -1;
  // h ::= "" | h X (X*) or h ::= X | h X (X+).
  for (int i = 0; i < 2; ++i) {
    const int32_t a = alts[i], b = alts[1 - i];
    if (table_.kind(a) != K::kRule || table_.arg(a) != rule) continue;
    if (!Matches(a + 1, x) || table_.kind(a + 2) != K::kEnd) return -1;
    if (table_.kind(b) == K::kEnd) {
      *plus = false;
      return cap;
    }
    if (Matches(b, x) && table_.kind(b + 1) == K::kEnd) {
      *plus = true;
      return cap;
    }
    return -1;
  }
  // Tj ::= "" | X T(j-1), T1 ::= "" | X. Levels beyond the horizon are not looked at:
  // a token (at most `horizon_` bytes, a copy at least one) never reaches them.
  *plus = false;
  int64_t j = 0;
  for (int32_t r = rule; j <= cap;) {
    const auto& two = table_.alternatives(r);
    if (two.size() != 2) return -1;
    const bool first_empty = table_.kind(two[0]) == K::kEnd;
    const int32_t s = first_empty ? two[1] : two[0];
    if (table_.kind(first_empty ? two[0] : two[1]) != K::kEnd || !Matches(s, x)) return -1;
    ++j;
    if (table_.kind(s + 1) == K::kEnd) return j;
    if (table_.kind(s + 1) != K::kRule || table_.kind(s + 2) != K::kEnd) return -1;
    r = table_.arg(s + 1);
  }
  return j;
}

bool CountedRepetitions::Recognize(int32_t p, Run* run) const {
  if (!ElementOf(p, &run->x)) return false;
  const Element& x = run->x;
  const int64_t cap = horizon_ + 1;
  int64_t k = 0;
  int32_t q = p;
  while (k <= cap && Matches(q, x)) {
    ++k;
    ++q;
  }
  if (k > cap) {
    // No token gets past the required copies: what follows them does not matter.
    run->min = k;
    run->max = cap;
    run->uncapped = k;
    run->after = -1;
    return true;
  }
  int64_t optional = 0;
  if (table_.kind(q) == RuleTable::kRule) {
    bool plus = false;
    const int64_t j = OptionalCopies(table_.arg(q), x, &plus);
    if (j >= 0) {
      optional = j;
      k += plus ? 1 : 0;
      ++q;
    }
  }
  run->min = k;
  run->uncapped = k + optional;
  run->max = std::min(k + optional, cap);
  run->after = q;
  return run->uncapped >= kMinCopies;
}

absl::StatusOr<CountedRepetitions::Figures*> CountedRepetitions::FiguresFor(const Element& x) {
  std::string key = x.terminal ? std::string("t") : absl::StrCat("r", x.canonical);
  if (x.terminal) key.append(reinterpret_cast<const char*>(x.set.bits.data()), sizeof(x.set.bits));
  if (auto it = figures_.find(key); it != figures_.end()) return it->second.get();
  auto f = std::make_unique<Figures>();
  bool usable = true;
  if (x.terminal) {
    f->first = x.set;
  } else {
    f->start = machine_.Enter(x.rule);
    if (machine_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
    // A copy matching nothing, or the empty string, has no boundaries to count by.
    usable = f->start != StackMachine::kDead && !machine_.HasExit(f->start);
    if (usable) f->first = machine_.NextBytes(f->start);
  }
  const size_t buckets = static_cast<size_t>(horizon_) + 2;
  f->pure.resize(buckets);
  f->stay.resize(buckets);
  f->leave.resize(buckets);
  f->die.resize(buckets);
  f->bounds.push_back({-1, 0, 0});
  const auto& trie = vocab_.trie();
  const auto& sorted = vocab_.sorted_tokens();
  uint32_t until_check = 0;
  bool expired = false;
  // Depth-first over the trie; `at` is the state inside the current copy (f->start at a
  // boundary), `bound` the path's last boundary.
  struct Frame {
    int32_t node;
    StackMachine::State at;
    bool boundary;
    int32_t bound;
  };
  std::vector<Frame> todo;
  if (usable) todo.push_back({0, f->start, true, 0});
  while (!todo.empty() && usable && !expired) {
    const Frame fr = todo.back();
    todo.pop_back();
    if (++until_check >= kNodesPerDeadlineCheck) {
      until_check = 0;
      expired = deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_;
    }
    const GrammarVocabulary::TrieNode& n = trie[fr.node];
    const int32_t count = f->bounds[fr.bound].count;
    std::vector<int32_t>& pure = f->pure[fr.boundary ? count : count + 1];
    for (int32_t t = n.tok_begin; t < n.tok_here_end; ++t) pure.push_back(sorted[t]);
    for (int32_t c = fr.node + 1; c < n.end; c = trie[c].end) {
      const uint8_t b = trie[c].byte;
      StackMachine::State from = fr.at;
      if (fr.boundary) {
        if (!f->first.Contains(b)) {
          f->leave[count].push_back({c, fr.bound});
          continue;
        }
        f->stay[count].push_back({c, fr.bound});
        from = f->start;
      } else if (!machine_.NextBytes(fr.at).Contains(b)) {
        f->die[count].push_back({c, fr.bound});
        continue;
      }
      StackMachine::State t = f->start;
      bool boundary = true;
      if (!x.terminal) {
        t = machine_.Step(from, b);
        if (t == StackMachine::kDead) return absl::FailedPreconditionError("stack machine cannot run this grammar");
        boundary = machine_.HasExit(t);
        // A copy that a longer one extends: the split into copies is not unique.
        if (boundary && !machine_.NextBytes(t).Empty()) {
          usable = false;
          break;
        }
      }
      if (boundary) {
        f->bounds.push_back({fr.bound, count + 1, trie[c].depth});
        todo.push_back({c, f->start, true, static_cast<int32_t>(f->bounds.size() - 1)});
      } else {
        todo.push_back({c, t, false, fr.bound});
      }
    }
  }
  if (expired) return absl::DeadlineExceededError("token walk passed its deadline");
  if (!usable) f.reset();
  return figures_.emplace(std::move(key), std::move(f)).first->second.get();
}

absl::StatusOr<bool> CountedRepetitions::Derive(int32_t p, std::vector<int32_t>* accepted,
                                               std::vector<UncertainSubtree>* uncertain) {
  Run run;
  if (!Recognize(p, &run)) return false;
  absl::StatusOr<Figures*> figures = FiguresFor(run.x);
  if (!figures.ok()) return figures.status();
  if (*figures == nullptr) return false;
  const Figures& f = **figures;
  StackMachine::State r = StackMachine::kDead;  // R's start
  bool exits = false;
  ByteSet next;
  if (run.after >= 0) {
    r = machine_.Initial({&run.after, 1});
    if (machine_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
    if (r == StackMachine::kDead) return false;
    exits = machine_.HasExit(r);
    next = machine_.NextBytes(r);
    if (Intersect(f.first, next)) return false;
  }
  const auto& trie = vocab_.trie();
  const int64_t kmin = run.min, kmax = run.max;
  for (int64_t n = 0; n <= kmax; ++n) accepted->insert(accepted->end(), f.pure[n].begin(), f.pure[n].end());
  // The depths on the event's path at which R's start exits: the boundaries of copies
  // kmin..upto.
  std::vector<int32_t> depths;
  const auto exit_depths = [&](int32_t bound, int64_t upto) {
    depths.clear();
    for (int32_t b = bound; b >= 0 && f.bounds[b].count >= kmin; b = f.bounds[b].parent) {
      if (f.bounds[b].count <= upto) depths.push_back(f.bounds[b].depth);
    }
  };
  const auto dead = [&](const Figures::Event& e) {
    if (!exits) return;
    exit_depths(e.bound, f.bounds[e.bound].count);
    for (int32_t d : depths) uncertain->push_back({e.node, d});
  };
  uint32_t until_check = 0;
  const int64_t last = std::min<int64_t>(kmax, horizon_);  // events lie above a token's last byte
  for (int64_t n = 0; n <= last; ++n) {
    if (++until_check >= 16) {
      until_check = 0;
      if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) {
        return absl::DeadlineExceededError("precomputation passed its deadline");
      }
    }
    if (exits) {
      // Out of copies: X may not go on, and R does not start with X's bytes.
      if (n == kmax) {
        for (const Figures::Event& e : f.stay[n]) dead(e);
      } else {
        for (const Figures::Event& e : f.die[n]) dead(e);
      }
    }
    for (const Figures::Event& e : f.leave[n]) {
      if (n < kmin || !next.Contains(trie[e.node].byte)) {
        dead(e);
        continue;
      }
      auto it = subtrees_.find({r, e.node});
      if (it == subtrees_.end()) {
        Subtree s;
        if (absl::Status st = walker_.WalkShifted(r, e.node, trie[e.node].depth - 1, &s.accepted, &s.uncertain);
            !st.ok()) {
          return st;
        }
        it = subtrees_.emplace(std::pair{r, e.node}, std::move(s)).first;
      }
      const Subtree& s = it->second;
      accepted->insert(accepted->end(), s.accepted.begin(), s.accepted.end());
      uncertain->insert(uncertain->end(), s.uncertain.begin(), s.uncertain.end());
      if (!exits || n == kmin) continue;
      // The walk of R began at this boundary; the earlier ones exited too.
      exit_depths(e.bound, n - 1);
      for (size_t i = 0; i < s.uncertain.size(); ++i) {
        if (i > 0 && s.uncertain[i].node == s.uncertain[i - 1].node) continue;
        for (int32_t d : depths) uncertain->push_back({s.uncertain[i].node, d});
      }
    }
  }
  std::sort(uncertain->begin(), uncertain->end());
  uncertain->erase(std::unique(uncertain->begin(), uncertain->end()), uncertain->end());
  ++derived_;
  return true;
}

}  // namespace tandem::grammar
