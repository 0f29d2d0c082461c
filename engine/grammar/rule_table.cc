#include "engine/grammar/rule_table.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"

namespace tandem::grammar {
namespace {

using Alternatives = std::vector<std::vector<Symbol>>;

struct WorkRule {
  std::string name;
  Alternatives alts;
  int32_t repeat_remaining = 0;
};

// A reference to a rule: rules[rule].alts[alt][index].
struct Site {
  int32_t rule;
  int32_t alt;
  int32_t index;
};

bool IsLeftSelf(int32_t rule, int32_t index, Symbol s) { return index == 0 && s.is_rule() && s.rule() == rule; }

// Strongly connected components of the reference graph without left-recursive self
// references (Tarjan, iterative: lowered repetitions make chains thousands of rules
// deep). Returns the components in reverse topological order (a component after every
// component it references) and marks the recursive rules.
std::vector<std::vector<int32_t>> Components(const std::vector<WorkRule>& rules, std::vector<char>* recursive) {
  const int32_t n = static_cast<int32_t>(rules.size());
  std::vector<std::vector<int32_t>> edges(n);
  recursive->assign(n, 0);
  for (int32_t r = 0; r < n; ++r) {
    for (const auto& alt : rules[r].alts) {
      for (size_t i = 0; i < alt.size(); ++i) {
        const Symbol s = alt[i];
        if (!s.is_rule() || IsLeftSelf(r, static_cast<int32_t>(i), s)) continue;
        if (s.rule() == r) (*recursive)[r] = 1;
        edges[r].push_back(s.rule());
      }
    }
  }
  std::vector<int32_t> index(n, -1), low(n, 0);
  std::vector<char> on_stack(n, 0);
  std::vector<int32_t> stack;
  std::vector<std::vector<int32_t>> out;
  int32_t counter = 0;
  struct Frame {
    int32_t v;
    size_t next;
  };
  for (int32_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    std::vector<Frame> call = {{root, 0}};
    index[root] = low[root] = counter++;
    stack.push_back(root);
    on_stack[root] = 1;
    while (!call.empty()) {
      Frame& f = call.back();
      if (f.next < edges[f.v].size()) {
        const int32_t w = edges[f.v][f.next++];
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = 1;
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[f.v] = std::min(low[f.v], index[w]);
        }
        continue;
      }
      const int32_t v = f.v;
      if (low[v] == index[v]) {
        std::vector<int32_t> comp;
        int32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp.push_back(w);
        } while (w != v);
        if (comp.size() > 1) {
          for (int32_t x : comp) (*recursive)[x] = 1;
        }
        out.push_back(std::move(comp));
      }
      call.pop_back();
      if (!call.empty()) low[call.back().v] = std::min(low[call.back().v], low[v]);
    }
  }
  return out;
}

size_t OwnSize(const WorkRule& r) {
  size_t n = 0;
  for (const auto& alt : r.alts) n += alt.size() + 1;
  return n;
}

void Specialize(std::vector<WorkRule>* rules_ptr, int32_t start, const RuleTableOptions& options, size_t* copies) {
  std::vector<WorkRule>& rules = *rules_ptr;
  std::vector<char> recursive;
  const std::vector<std::vector<int32_t>> comps = Components(rules, &recursive);
  const size_t n0 = rules.size();
  const size_t limit = options.max_copied_rule_size;

  // Tree sizes, children first (saturating above the limit; recursive rules never copy).
  std::vector<size_t> tree(n0, 0);
  for (const auto& comp : comps) {
    for (int32_t r : comp) {
      if (recursive[r]) {
        tree[r] = limit + 1;
        continue;
      }
      size_t t = OwnSize(rules[r]);
      for (const auto& alt : rules[r].alts) {
        for (size_t i = 0; i < alt.size() && t <= limit; ++i) {
          if (alt[i].is_rule() && !IsLeftSelf(r, static_cast<int32_t>(i), alt[i])) t += tree[alt[i].rule()];
        }
      }
      tree[r] = std::min(t, limit + 1);
    }
  }
  std::vector<std::vector<Site>> sites(n0);
  for (int32_t r = 0; r < static_cast<int32_t>(n0); ++r) {
    for (int32_t a = 0; a < static_cast<int32_t>(rules[r].alts.size()); ++a) {
      const auto& alt = rules[r].alts[a];
      for (int32_t i = 0; i < static_cast<int32_t>(alt.size()); ++i) {
        if (alt[i].is_rule() && !IsLeftSelf(r, i, alt[i])) sites[alt[i].rule()].push_back({r, a, i});
      }
    }
  }
  size_t budget = options.specialization_budget;
  // Parents first: the reverse of Tarjan's order.
  for (auto it = comps.rbegin(); it != comps.rend(); ++it) {
    for (int32_t r : *it) {
      if (r == start || recursive[r] || tree[r] > limit || sites[r].size() <= 1) continue;
      const size_t cost = (sites[r].size() - 1) * OwnSize(rules[r]);
      if (cost > budget) continue;
      budget -= cost;
      const std::vector<Site> mine = sites[r];
      sites[r] = {mine[0]};
      for (size_t k = 1; k < mine.size(); ++k) {
        const int32_t copy = static_cast<int32_t>(rules.size());
        WorkRule w{absl::StrCat(rules[r].name, "@", k), rules[r].alts, rules[r].repeat_remaining};
        for (int32_t a = 0; a < static_cast<int32_t>(w.alts.size()); ++a) {
          auto& alt = w.alts[a];
          for (int32_t i = 0; i < static_cast<int32_t>(alt.size()); ++i) {
            if (!alt[i].is_rule()) continue;
            if (IsLeftSelf(r, i, alt[i])) {
              alt[i] = Symbol::Rule(copy);
            } else {
              sites[alt[i].rule()].push_back({copy, a, i});
            }
          }
        }
        rules.push_back(std::move(w));
        const Site s = mine[k];
        rules[s.rule].alts[s.alt][s.index] = Symbol::Rule(copy);
        ++*copies;
      }
    }
  }
}

}  // namespace

RuleTable RuleTable::Build(const Grammar& grammar, const RuleTableOptions& options) {
  std::vector<WorkRule> rules;
  for (const Grammar::Rule& r : grammar.rules()) rules.push_back({r.name, r.alternatives, r.repeat_remaining});
  const int32_t start = static_cast<int32_t>(rules.size());
  rules.push_back({"$start", {{Symbol::Rule(grammar.root())}}});
  RuleTable t;
  Specialize(&rules, start, options, &t.num_copies_);
  t.byte_sets_ = grammar.byte_sets();
  t.start_rule_ = start;
  const int32_t n = static_cast<int32_t>(rules.size());
  t.alt_starts_.resize(n);
  t.names_.resize(n);
  const auto add = [&](Kind k, int32_t arg, int32_t rule, int32_t dot) {
    t.kind_.push_back(k);
    t.arg_.push_back(arg);
    t.rule_of_.push_back(rule);
    t.dot_.push_back(dot);
    return static_cast<int32_t>(t.kind_.size() - 1);
  };
  for (int32_t r = 0; r < n; ++r) {
    t.names_[r] = rules[r].name;
    for (const auto& alt : rules[r].alts) {
      t.alt_starts_[r].push_back(static_cast<int32_t>(t.kind_.size()));
      for (size_t i = 0; i < alt.size(); ++i) {
        const Symbol s = alt[i];
        add(s.is_rule() ? kRule : kTerminal, s.is_rule() ? s.rule() : s.byte_set(), r, static_cast<int32_t>(i));
      }
      add(kEnd, r, r, static_cast<int32_t>(alt.size()));
    }
  }
  t.end_position_.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    int32_t p = t.alt_starts_[r][0];
    while (t.kind_[p] != kEnd) ++p;
    t.end_position_[r] = p;
  }
  t.exit_wait_.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    t.exit_wait_[r] = add(kRule, r, -1, 0);
    add(kExit, r, -1, 1);
  }
  // Nullable rules: a fixpoint.
  t.nullable_.assign(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      if (t.nullable_[r]) continue;
      for (int32_t p : t.alt_starts_[r]) {
        while (t.kind_[p] == kRule && t.nullable_[t.arg_[p]]) ++p;
        if (t.kind_[p] == kEnd) {
          t.nullable_[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  t.self_recursive_.assign(n, 0);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t a : t.alt_starts_[r]) {
      if (t.kind_[a] == kRule && t.arg_[a] == r) t.self_recursive_[r] = 1;
    }
  }
  t.sites_.resize(n);
  for (int32_t p = 0; p < static_cast<int32_t>(t.kind_.size()); ++p) {
    if (t.kind_[p] != kRule || t.rule_of_[p] < 0) continue;
    if (t.dot_[p] == 0 && t.arg_[p] == t.rule_of_[p]) continue;
    t.sites_[t.arg_[p]].push_back(p);
  }
  // Canonical numbers, children first: a non-recursive rule is its body with each
  // referenced rule replaced by that rule's number.
  std::vector<char> recursive;
  const std::vector<std::vector<int32_t>> comps = Components(rules, &recursive);
  t.canonical_.assign(n, -1);
  absl::flat_hash_map<std::string, int32_t> interned;
  int32_t next = 0;
  for (const auto& comp : comps) {
    for (int32_t r : comp) {
      if (recursive[r]) {
        t.canonical_[r] = next++;
        continue;
      }
      std::string key;
      for (const auto& alt : rules[r].alts) {
        for (size_t i = 0; i < alt.size(); ++i) {
          const Symbol s = alt[i];
          if (!s.is_rule()) {
            absl::StrAppend(&key, "t", s.byte_set(), " ");
          } else if (IsLeftSelf(r, static_cast<int32_t>(i), s)) {
            absl::StrAppend(&key, "s ");
          } else {
            TANDEM_CHECK(t.canonical_[s.rule()] >= 0);
            absl::StrAppend(&key, "r", t.canonical_[s.rule()], " ");
          }
        }
        absl::StrAppend(&key, "|");
      }
      // A repetition rule beyond the horizon is its child's equal (the child is the
      // chain's next rule, already numbered).
      const int32_t remaining = rules[r].repeat_remaining;
      if (options.repeat_horizon > 0 && remaining > options.repeat_horizon + 1) {
        const auto& alt = rules[r].alts.back();
        if (alt.size() == 2 && alt[1].is_rule() && rules[alt[1].rule()].repeat_remaining == remaining - 1) {
          t.canonical_[r] = t.canonical_[alt[1].rule()];
          continue;
        }
      }
      auto [it, inserted] = interned.try_emplace(std::move(key), next);
      if (inserted) ++next;
      t.canonical_[r] = it->second;
    }
  }
  t.num_canonical_ = static_cast<size_t>(next);
  return t;
}

}  // namespace tandem::grammar
