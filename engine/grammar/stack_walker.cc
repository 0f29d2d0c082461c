#include "engine/grammar/stack_walker.h"

#include <algorithm>
#include <cstring>

#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {

// Deeper stacks, or closures of more expansions, mean a closure that does not terminate
// (or one too costly to be worth it): the caller falls back to the Earley walker.
constexpr size_t kMaxStackDepth = 2048;
constexpr int kMaxExpansions = 200000;
constexpr uint32_t kStepsPerDeadlineCheck = 4096;
constexpr uint64_t kWorkPerDeadlineCheck = 1 << 16;

std::string Key(const std::vector<int32_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
}

}  // namespace

StackMachine::StackMachine(const RuleTable& table)
    : t_(table), plain_alts_(table.num_rules()), self_alts_(table.num_rules()) {
  for (size_t r = 0; r < table.num_rules(); ++r) {
    for (int32_t a : table.alternatives(static_cast<int32_t>(r))) {
      if (table.kind(a) == RuleTable::kRule && table.arg(a) == static_cast<int32_t>(r)) {
        self_alts_[r].push_back(a + 1);
      } else {
        plain_alts_[r].push_back(a);
      }
    }
  }
}

void StackMachine::Expand(std::vector<int32_t>& stack, std::vector<int32_t>* out, bool* exit, bool* can_end,
                          int budget) {
  if (failed_) return;
  if (stack.size() > kMaxStackDepth || static_cast<int>(seen_.size()) > kMaxExpansions) {
    failed_ = true;
    return;
  }
  if (!seen_.emplace(Key(stack), 1).second) return;
  ++work_;
  const int32_t top = stack.back();
  switch (t_.kind(top)) {
    case RuleTable::kTerminal:
      out->push_back(static_cast<int32_t>(stack.size()));
      out->insert(out->end(), stack.begin(), stack.end());
      return;
    case RuleTable::kRule: {
      const int32_t rule = t_.arg(top);
      for (int32_t a : plain_alts_[rule]) {
        stack.push_back(a);
        Expand(stack, out, exit, can_end, budget - 1);
        stack.pop_back();
      }
      return;
    }
    case RuleTable::kEnd: {
      const int32_t rule = t_.arg(top);
      stack.pop_back();
      for (int32_t s : self_alts_[rule]) {  // h ::= h X ...: loop at this depth
        stack.push_back(s);
        Expand(stack, out, exit, can_end, budget - 1);
        stack.pop_back();
      }
      if (stack.empty()) {
        if (rule == t_.start_rule()) {
          *can_end = true;
        } else {
          *exit = true;
        }
      } else {
        // The parent expects this rule, or one that completes with it at once (a tail
        // site the caller's stack skipped, or an equal rule of the same canonical class).
        const int32_t parent = stack.back();
        TANDEM_CHECK(t_.kind(parent) == RuleTable::kRule);
        stack.back() = parent + 1;
        Expand(stack, out, exit, can_end, budget - 1);
        stack.back() = parent;
      }
      stack.push_back(top);
      return;
    }
    case RuleTable::kExit:
      return;
  }
}

StackMachine::State StackMachine::Intern(std::vector<int32_t> stacks, bool exit, bool can_end) {
  // Canonical order: the stacks sorted (each a length-prefixed run).
  std::vector<std::pair<size_t, size_t>> runs;  // (begin, length) of each stack's positions
  for (size_t i = 0; i < stacks.size(); i += stacks[i] + 1) runs.push_back({i + 1, static_cast<size_t>(stacks[i])});
  std::sort(runs.begin(), runs.end(), [&](const auto& a, const auto& b) {
    return std::lexicographical_compare(stacks.begin() + a.first, stacks.begin() + a.first + a.second,
                                        stacks.begin() + b.first, stacks.begin() + b.first + b.second);
  });
  std::vector<int32_t> canon;
  canon.reserve(stacks.size() + 1);
  canon.push_back((exit ? 1 : 0) | (can_end ? 2 : 0));
  for (const auto& [b, n] : runs) {
    canon.push_back(static_cast<int32_t>(n));
    canon.insert(canon.end(), stacks.begin() + b, stacks.begin() + b + n);
  }
  std::string key = Key(canon);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  StateData d;
  d.exit = exit;
  d.can_end = can_end;
  d.stacks.assign(canon.begin() + 1, canon.end());
  for (size_t i = 0; i < d.stacks.size(); i += d.stacks[i] + 1) {
    const ByteSet& s = t_.byte_set(d.stacks[i + d.stacks[i]]);
    for (int k = 0; k < 4; ++k) d.next.bits[k] |= s.bits[k];
  }
  const State id = static_cast<State>(states_.size());
  states_.push_back(std::move(d));
  index_.emplace(std::move(key), id);
  return id;
}

StackMachine::State StackMachine::Initial(std::span<const int32_t> positions) {
  std::vector<int32_t> stack(positions.begin(), positions.end());
  std::vector<int32_t> out;
  bool exit = false, can_end = false;
  seen_.clear();
  Expand(stack, &out, &exit, &can_end, kMaxExpansions);
  if (failed_) return kDead;
  if (out.empty() && !exit && !can_end) return kDead;
  return Intern(std::move(out), exit, can_end);
}

StackMachine::State StackMachine::Enter(int32_t rule) {
  std::vector<int32_t> out;
  bool exit = false, can_end = false;
  seen_.clear();
  std::vector<int32_t> stack;
  for (int32_t a : plain_alts_[rule]) {
    stack.assign(1, a);
    Expand(stack, &out, &exit, &can_end, kMaxExpansions);
  }
  if (failed_ || (out.empty() && !exit && !can_end)) return kDead;
  return Intern(std::move(out), exit, can_end);
}

StackMachine::State StackMachine::Step(State s, uint8_t byte) {
  std::vector<State>& row = states_[s].next_state;
  if (row.empty()) row.assign(256, kUnknown);
  if (row[byte] != kUnknown) return row[byte];
  const State next = Compute(s, byte);
  states_[s].next_state[byte] = next;  // states_ may have grown: index again
  return next;
}

StackMachine::State StackMachine::Compute(State s, uint8_t byte) {
  std::vector<int32_t> out;
  bool exit = false, can_end = false;
  seen_.clear();
  std::vector<int32_t> stack;
  const std::vector<int32_t>& stacks = states_[s].stacks;  // Intern (which grows states_) runs after
  for (size_t i = 0; i < stacks.size(); i += stacks[i] + 1) {
    const size_t n = static_cast<size_t>(stacks[i]);
    const int32_t top = stacks[i + n];
    if (!t_.byte_set(top).Contains(byte)) continue;
    stack.assign(stacks.begin() + i + 1, stacks.begin() + i + 1 + n);
    stack.back() = top + 1;
    Expand(stack, &out, &exit, &can_end, kMaxExpansions);
  }
  if (failed_ || (out.empty() && !exit && !can_end)) return kDead;
  return Intern(std::move(out), exit, can_end);
}

StackTrieWalker::StackTrieWalker(const GrammarVocabulary& vocabulary, StackMachine* machine, absl::Time deadline)
    : vocab_(vocabulary), m_(*machine), deadline_(deadline) {}

void StackTrieWalker::WalkSubtree(int32_t node, StackMachine::State s) {
  const auto& trie = vocab_.trie();
  const auto& sorted = vocab_.sorted_tokens();
  const GrammarVocabulary::TrieNode& n = trie[node];
  for (int32_t k = n.tok_begin; k < n.tok_here_end; ++k) accepted_->push_back(sorted[k]);
  if (node + 1 >= n.end) return;
  const ByteSet next = m_.NextBytes(s);
  for (int32_t c = node + 1; c < n.end; c = trie[c].end) {
    if (expired_ || m_.failed()) return;
    if (!next.Contains(trie[c].byte)) {
      Uncertain(c);
      continue;
    }
    const StackMachine::State t = m_.Step(s, trie[c].byte);
    if (t == StackMachine::kDead) return;  // only when the machine failed
    ++steps_;
    if (++until_check_ >= kStepsPerDeadlineCheck || m_.work() - checked_at_work_ >= kWorkPerDeadlineCheck) {
      until_check_ = 0;
      checked_at_work_ = m_.work();
      if (deadline_ != absl::InfiniteFuture() && absl::Now() > deadline_) expired_ = true;
    }
    const bool exits = m_.HasExit(t);
    if (exits) exit_depths_.push_back(trie[c].depth);
    WalkSubtree(c, t);
    if (exits) exit_depths_.pop_back();
  }
}

absl::Status StackTrieWalker::WalkShifted(StackMachine::State start, int32_t node, int32_t offset,
                                          std::vector<int32_t>* accepted, std::vector<UncertainSubtree>* uncertain) {
  if (start == StackMachine::kDead) return absl::FailedPreconditionError("stack machine cannot run this grammar");
  accepted_ = accepted;
  uncertain_ = uncertain;
  exit_depths_.clear();
  if (m_.HasExit(start)) exit_depths_.push_back(offset);
  const std::string_view path = vocab_.NodePath(node);
  StackMachine::State s = start;
  for (size_t d = static_cast<size_t>(offset); d < path.size(); ++d) {
    if (!m_.NextBytes(s).Contains(static_cast<uint8_t>(path[d]))) {
      Uncertain(node);
      return absl::OkStatus();
    }
    s = m_.Step(s, static_cast<uint8_t>(path[d]));
    if (s == StackMachine::kDead) break;
    if (m_.HasExit(s)) exit_depths_.push_back(static_cast<int32_t>(d + 1));
  }
  if (!m_.failed()) WalkSubtree(node, s);
  if (m_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
  if (expired_) return absl::DeadlineExceededError("token walk passed its deadline");
  return absl::OkStatus();
}

absl::Status StackTrieWalker::Walk(StackMachine::State start, std::span<const int32_t> nodes,
                                   std::vector<int32_t>* accepted, std::vector<UncertainSubtree>* uncertain) {
  if (start == StackMachine::kDead) return absl::FailedPreconditionError("stack machine cannot run this grammar");
  accepted_ = accepted;
  uncertain_ = uncertain;
  // The states along the path to the previous node (path_states[d]: after d bytes), so
  // that consecutive nodes share their common prefix.
  std::vector<StackMachine::State> path_states = {start};
  std::string_view path;
  exit_depths_.clear();
  if (m_.HasExit(start)) exit_depths_.push_back(0);
  for (int32_t node : nodes) {
    const std::string_view want = vocab_.NodePath(node);
    size_t lcp = 0;
    while (lcp < path.size() && lcp < want.size() && path[lcp] == want[lcp]) ++lcp;
    path_states.resize(lcp + 1);
    while (!exit_depths_.empty() && exit_depths_.back() > static_cast<int32_t>(lcp)) exit_depths_.pop_back();
    path = want.substr(0, lcp);
    bool alive = true;
    for (size_t d = lcp; d < want.size(); ++d) {
      const StackMachine::State s = path_states.back();
      if (!m_.NextBytes(s).Contains(static_cast<uint8_t>(want[d]))) {
        alive = false;
        break;
      }
      const StackMachine::State t = m_.Step(s, static_cast<uint8_t>(want[d]));
      if (t == StackMachine::kDead) break;  // only when the machine failed
      path_states.push_back(t);
      path = want.substr(0, d + 1);
      if (m_.HasExit(t)) exit_depths_.push_back(static_cast<int32_t>(d + 1));
    }
    if (m_.failed()) break;
    if (!alive) {
      Uncertain(node);
    } else {
      const size_t depth = path.size();
      WalkSubtree(node, path_states.back());
      while (!exit_depths_.empty() && exit_depths_.back() > static_cast<int32_t>(depth)) exit_depths_.pop_back();
    }
    if (expired_ || m_.failed()) break;
  }
  if (m_.failed()) return absl::FailedPreconditionError("stack machine cannot run this grammar");
  if (expired_) return absl::DeadlineExceededError("token walk passed its deadline");
  return absl::OkStatus();
}

}  // namespace tandem::grammar
