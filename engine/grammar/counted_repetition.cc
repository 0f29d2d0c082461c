#include "engine/grammar/counted_repetition.h"

#include <algorithm>
#include <string_view>
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
    int32_t node;    // the child the byte leads to (or, on a start's path, the start's node)
    int32_t offset;  // the byte's depth in the token
    int32_t bound;   // the last boundary above it
  };
  StackMachine::State start = StackMachine::kDead;  // X alone (rules only)
  ByteSet first;                                    // bytes that start a copy
  std::vector<Boundary> bounds;
  int64_t most = 0;  // the largest count of copies at a boundary
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

bool CountedRepetitions::Recognize(int32_t p, Run* run) {
  // Step 2 asks again for every group of candidates at the same positions, and the
  // chain of optional copies is followed up to the horizon each time.
  if (auto it = runs_.find(p); it != runs_.end()) {
    *run = it->second.first;
    return it->second.second;
  }
  const bool found = RecognizeOnce(p, run);
  runs_.emplace(p, std::pair{*run, found});
  return found;
}

bool CountedRepetitions::RecognizeOnce(int32_t p, Run* run) const {
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

std::string CountedRepetitions::KeyOf(const Element& x) {
  std::string key = x.terminal ? std::string("t") : absl::StrCat("r", x.canonical);
  if (x.terminal) key.append(reinterpret_cast<const char*>(x.set.bits.data()), sizeof(x.set.bits));
  return key;
}

absl::StatusOr<std::unique_ptr<CountedRepetitions::Figures>> CountedRepetitions::Compute(
    const Element& x, std::span<const UncertainSubtree> starts) {
  auto f = std::make_unique<Figures>();
  if (x.terminal) {
    f->first = x.set;
  } else {
    f->start = machine_.Enter(x.rule);
    if (machine_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
    // A copy matching nothing, or the empty string, has no boundaries to count by.
    if (f->start == StackMachine::kDead || machine_.HasExit(f->start)) return nullptr;
    f->first = machine_.NextBytes(f->start);
  }
  const size_t buckets = static_cast<size_t>(horizon_) + 2;
  f->pure.resize(buckets);
  f->stay.resize(buckets);
  f->leave.resize(buckets);
  f->die.resize(buckets);
  const auto& trie = vocab_.trie();
  const auto& sorted = vocab_.sorted_tokens();
  // Where the walk is: the state inside the current copy (f->start at a boundary) and
  // the path's last boundary.
  struct At {
    StackMachine::State state;
    bool boundary;
    int32_t bound;
  };
  enum Outcome { kEvent, kGoesOn, kNotPrefixFree };
  // The byte at depth `offset` of the tokens below `node`: an event (recorded), or the
  // walk goes on in `at`.
  const auto advance = [&](At* at, uint8_t b, int32_t node, int32_t offset) -> absl::StatusOr<Outcome> {
    const int32_t count = f->bounds[at->bound].count;
    StackMachine::State from = at->state;
    if (at->boundary) {
      if (!f->first.Contains(b)) {
        f->leave[count].push_back({node, offset, at->bound});
        return kEvent;
      }
      f->stay[count].push_back({node, offset, at->bound});
      from = f->start;
    } else if (!machine_.NextBytes(at->state).Contains(b)) {
      f->die[count].push_back({node, offset, at->bound});
      return kEvent;
    }
    StackMachine::State t = f->start;
    bool boundary = true;
    if (!x.terminal) {
      t = machine_.Step(from, b);
      if (t == StackMachine::kDead) return absl::FailedPreconditionError("stack machine cannot run this grammar");
      boundary = machine_.HasExit(t);
      // A copy that a longer one extends: the split into copies is not unique.
      if (boundary && !machine_.NextBytes(t).Empty()) return kNotPrefixFree;
    }
    if (boundary) {
      f->bounds.push_back({at->bound, count + 1, offset + 1});
      *at = {f->start, true, static_cast<int32_t>(f->bounds.size() - 1)};
    } else {
      *at = {t, false, at->bound};
    }
    return kGoesOn;
  };
  uint32_t until_check = 0;
  const auto expired = [&] {
    if (++until_check < kNodesPerDeadlineCheck) return false;
    until_check = 0;
    return deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_;
  };
  // Depth-first over the starts' subtrees; a start's path from its offset first.
  struct Frame {
    int32_t node;
    At at;
  };
  std::vector<Frame> todo;
  for (const UncertainSubtree& s : starts) {
    f->bounds.push_back({-1, 0, s.depth});
    At at{f->start, true, static_cast<int32_t>(f->bounds.size() - 1)};
    const std::string_view path = vocab_.NodePath(s.node);
    Outcome o = kGoesOn;
    for (size_t d = static_cast<size_t>(s.depth); d < path.size() && o == kGoesOn; ++d) {
      absl::StatusOr<Outcome> r = advance(&at, static_cast<uint8_t>(path[d]), s.node, static_cast<int32_t>(d));
      if (!r.ok()) return r.status();
      o = *r;
    }
    if (o == kNotPrefixFree) return nullptr;
    if (o == kGoesOn) todo.push_back({s.node, at});
    while (!todo.empty()) {
      const Frame fr = todo.back();
      todo.pop_back();
      if (expired()) return absl::DeadlineExceededError("token walk passed its deadline");
      const GrammarVocabulary::TrieNode& n = trie[fr.node];
      const int32_t count = f->bounds[fr.at.bound].count;
      std::vector<int32_t>& pure = f->pure[fr.at.boundary ? count : count + 1];
      for (int32_t t = n.tok_begin; t < n.tok_here_end; ++t) pure.push_back(sorted[t]);
      for (int32_t c = fr.node + 1; c < n.end; c = trie[c].end) {
        At at = fr.at;
        absl::StatusOr<Outcome> r = advance(&at, trie[c].byte, c, trie[c].depth - 1);
        if (!r.ok()) return r.status();
        if (*r == kNotPrefixFree) return nullptr;
        if (*r == kGoesOn) todo.push_back({c, at});
      }
    }
  }
  return f;
}

absl::StatusOr<bool> CountedRepetitions::Derive(int32_t p, std::vector<int32_t>* accepted,
                                               std::vector<UncertainSubtree>* uncertain) {
  Run run;
  if (!Recognize(p, &run)) return false;
  std::string key = KeyOf(run.x);
  auto it = figures_.find(key);
  if (it == figures_.end()) {
    const UncertainSubtree root{0, 0};
    absl::StatusOr<std::unique_ptr<Figures>> f = Compute(run.x, {&root, 1});
    if (!f.ok()) return f.status();
    it = figures_.emplace(std::move(key), *std::move(f)).first;
  }
  if (it->second == nullptr) return false;
  absl::StatusOr<bool> done = Apply(*it->second, run, {&run.after, run.after >= 0 ? 1u : 0u}, accepted, uncertain);
  if (done.ok() && *done) ++derived_;
  return done;
}

absl::StatusOr<const CountedRepetitions::Outcome*> CountedRepetitions::DeriveShifted(
    std::span<const int32_t> stack, int64_t group, std::span<const UncertainSubtree> starts) {
  Run run;
  if (stack.empty() || !Recognize(stack.back(), &run)) return nullptr;
  std::string key = absl::StrCat(KeyOf(run.x), "@", group);
  auto it = figures_.find(key);
  if (it == figures_.end()) {
    absl::StatusOr<std::unique_ptr<Figures>> f = Compute(run.x, starts);
    if (!f.ok()) return f.status();
    if (*f != nullptr) {
      for (const Figures::Boundary& b : (*f)->bounds) (*f)->most = std::max<int64_t>((*f)->most, b.count);
    }
    it = figures_.emplace(std::move(key), *std::move(f)).first;
  }
  if (it->second == nullptr) return nullptr;
  const Figures& f = *it->second;
  std::vector<int32_t> rest;
  const StackMachine::State r = After(stack, run, &rest);
  if (machine_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
  // No token of the group reaches a boundary past f.most copies: counts beyond that
  // (the copies of X far from a bound, or a bound farther than the group's tokens) give
  // the same outcome. Exact: Apply looks at counts only as compared with the boundaries'.
  const std::tuple<const Figures*, int64_t, int64_t, int32_t> memo{&f, std::min(run.min, f.most + 1),
                                                                   std::min(run.max, f.most + 1), r};
  if (auto done = shifted_.find(memo); done != shifted_.end()) return &done->second;
  Outcome out;
  absl::StatusOr<bool> done = Apply(f, run, rest, &out.accepted, &out.uncertain);
  if (!done.ok()) return done.status();
  if (!*done) return nullptr;
  ++derived_groups_;
  return &shifted_.emplace(memo, std::move(out)).first->second;
}

StackMachine::State CountedRepetitions::After(std::span<const int32_t> stack, const Run& run,
                                              std::vector<int32_t>* rest) {
  rest->clear();
  if (run.after < 0) return StackMachine::kDead;
  rest->assign(stack.begin(), stack.end());
  rest->back() = run.after;
  return machine_.Initial(*rest);
}

bool CountedRepetitions::ClippedRun(std::span<const int32_t> stack, int64_t clip, std::vector<int32_t>* key) {
  Run run;
  if (stack.empty() || !Recognize(stack.back(), &run)) return false;
  std::vector<int32_t> rest;
  const StackMachine::State r = After(stack, run, &rest);
  if (machine_.failed() || (run.after >= 0 && r == StackMachine::kDead)) return false;
  if (run.x.terminal) {
    key->push_back(-1);
    for (uint64_t w : run.x.set.bits) {
      key->push_back(static_cast<int32_t>(w));
      key->push_back(static_cast<int32_t>(w >> 32));
    }
  } else {
    key->push_back(run.x.canonical);
  }
  key->push_back(static_cast<int32_t>(std::min(run.min, clip)));
  key->push_back(static_cast<int32_t>(std::min(run.max, clip)));
  key->push_back(r);
  return true;
}

absl::StatusOr<bool> CountedRepetitions::Apply(const Figures& f, const Run& run, std::span<const int32_t> rest,
                                              std::vector<int32_t>* accepted,
                                              std::vector<UncertainSubtree>* uncertain) {
  StackMachine::State r = StackMachine::kDead;  // R's start
  bool exits = false;
  ByteSet next;
  if (!rest.empty()) {
    r = machine_.Initial(rest);
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
      if (n < kmin || !next.Contains(static_cast<uint8_t>(vocab_.NodePath(e.node)[e.offset]))) {
        dead(e);
        continue;
      }
      auto it = subtrees_.find({r, e.node, e.offset});
      if (it == subtrees_.end()) {
        Outcome s;
        if (absl::Status st = walker_.WalkShifted(r, e.node, e.offset, &s.accepted, &s.uncertain); !st.ok()) {
          return st;
        }
        it = subtrees_.emplace(std::tuple{r, e.node, e.offset}, std::move(s)).first;
      }
      const Outcome& s = it->second;
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
  return true;
}

}  // namespace tandem::grammar
