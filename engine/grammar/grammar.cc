#include "engine/grammar/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/grammar/utf8_ranges.h"
#include "kernels/common/check.h"

namespace tandem::grammar {

std::string SourcePos::ToString() const {
  if (line > 0) {
    std::string s = absl::StrCat("line ", line, ", column ", column);
    if (!where.empty()) absl::StrAppend(&s, " (", where, ")");
    return s;
  }
  if (!where.empty()) return where;
  if (column > 0) return absl::StrCat("offset ", column - 1);
  return "";
}

Expr Expr::Empty(SourcePos pos) {
  Expr e;
  e.pos = std::move(pos);
  return e;
}

Expr Expr::WithText(Kind kind, std::string_view text, SourcePos pos) {
  Expr e;
  e.kind = kind;
  e.text = std::string(text);
  e.pos = std::move(pos);
  return e;
}

Expr Expr::Literal(std::string_view bytes, SourcePos pos) { return WithText(Kind::kLiteral, bytes, std::move(pos)); }

Expr Expr::Class(std::vector<CodepointRange> ranges, bool negated, SourcePos pos) {
  Expr e;
  e.kind = Kind::kClass;
  e.ranges = std::move(ranges);
  e.negated = negated;
  e.pos = std::move(pos);
  return e;
}

Expr Expr::Char(uint32_t cp, SourcePos pos) { return Class({{cp, cp}}, false, std::move(pos)); }

Expr Expr::AnyChar(SourcePos pos) { return Class({}, true, std::move(pos)); }

Expr Expr::Ref(std::string_view rule, SourcePos pos) { return WithText(Kind::kRule, rule, std::move(pos)); }

Expr Expr::Token(std::string_view name, SourcePos pos) { return WithText(Kind::kToken, name, std::move(pos)); }

std::string TokenMarker(std::string_view name) {
  std::string m;
  m.reserve(name.size() + 2);
  m.push_back(static_cast<char>(kTokenMarkerOpen));
  m.append(name);
  m.push_back(static_cast<char>(kTokenMarkerClose));
  return m;
}

bool HoldsMarkerByte(std::string_view bytes) {
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (b == kTokenMarkerOpen || b == kTokenMarkerClose) return true;
  }
  return false;
}

Expr Expr::Sequence(std::vector<Expr> children, SourcePos pos) {
  if (children.size() == 1) return std::move(children[0]);
  Expr e;
  e.kind = children.empty() ? Kind::kEmpty : Kind::kSequence;
  e.children = std::move(children);
  e.pos = std::move(pos);
  return e;
}

Expr Expr::Choice(std::vector<Expr> children, SourcePos pos) {
  if (children.size() == 1) return std::move(children[0]);
  Expr e;
  e.kind = Kind::kChoice;
  e.children = std::move(children);
  e.pos = std::move(pos);
  return e;
}

Expr Expr::Repeat(Expr child, int min, int max, SourcePos pos) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.children.push_back(std::move(child));
  e.min = min;
  e.max = max;
  e.pos = std::move(pos);
  return e;
}

std::vector<CodepointRange> NormalizeClass(std::vector<CodepointRange> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodepointRange& a, const CodepointRange& b) { return a.lo < b.lo; });
  std::vector<CodepointRange> merged;
  for (CodepointRange r : ranges) {
    if (r.lo > r.hi) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    if (r.lo > kMaxCodepoint) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    std::vector<CodepointRange> complement;
    uint32_t next = 0;
    for (const CodepointRange& r : merged) {
      if (r.lo > next) complement.push_back({next, r.lo - 1});
      next = r.hi + 1;
    }
    if (next <= kMaxCodepoint) complement.push_back({next, kMaxCodepoint});
    merged = std::move(complement);
  }
  // Surrogates have no UTF-8 encoding.
  std::vector<CodepointRange> out;
  for (const CodepointRange& r : merged) {
    if (r.hi < 0xD800 || r.lo > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.lo < 0xD800) out.push_back({r.lo, 0xD7FF});
    if (r.hi > 0xDFFF) out.push_back({0xE000, r.hi});
  }
  return out;
}

void ByteSet::AddRange(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
}

size_t Grammar::num_symbols() const {
  size_t n = 0;
  for (const Rule& r : rules_) {
    for (const auto& alt : r.alternatives) n += alt.size() + 1;
  }
  return n;
}

namespace {

std::string ByteSetToString(const ByteSet& set) {
  const auto show = [](int b) -> std::string {
    if (b >= 0x21 && b < 0x7F && b != '\\' && b != ']' && b != '-' && b != '^' && b != '"') {
      return std::string(1, static_cast<char>(b));
    }
    return absl::StrFormat("\\x%02X", b);
  };
  int count = 0;
  for (int b = 0; b < 256; ++b) count += set.Contains(static_cast<uint8_t>(b));
  if (count == 1) {
    for (int b = 0; b < 256; ++b) {
      if (set.Contains(static_cast<uint8_t>(b))) return absl::StrCat("\"", show(b), "\"");
    }
  }
  std::string s = "[";
  for (int b = 0; b < 256;) {
    if (!set.Contains(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.Contains(static_cast<uint8_t>(e + 1))) ++e;
    absl::StrAppend(&s, show(b));
    if (e > b) absl::StrAppend(&s, "-", show(e));
    b = e + 1;
  }
  return s + "]";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const Rule& r = rules_[i];
    absl::StrAppend(&out, r.name, " ::=");
    for (size_t a = 0; a < r.alternatives.size(); ++a) {
      if (a > 0) absl::StrAppend(&out, " |");
      if (r.alternatives[a].empty()) absl::StrAppend(&out, " \"\"");
      for (const Symbol& s : r.alternatives[a]) {
        absl::StrAppend(&out, " ",
                        s.is_rule() ? rules_[s.rule()].name : ByteSetToString(byte_sets_[s.byte_set()]));
      }
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

void GrammarBuilder::AddRule(std::string name, Expr body, SourcePos pos) {
  rules_.push_back({std::move(name), std::move(body), std::move(pos)});
}

bool GrammarBuilder::HasRule(std::string_view name) const {
  for (const PendingRule& r : rules_) {
    if (r.name == name) return true;
  }
  return false;
}

namespace {

constexpr int kMaxNesting = 4000;

absl::Status Error(const SourcePos& pos, std::string_view rule, std::string_view what) {
  std::string where = pos.ToString();
  return absl::InvalidArgumentError(
      absl::StrCat("grammar: rule '", std::string(rule), "'", where.empty() ? "" : absl::StrCat(" at ", where), ": ", std::string(what)));
}

struct ByteSetHash {
  size_t operator()(const ByteSet& s) const {
    return absl::HashOf(s.bits[0], s.bits[1], s.bits[2], s.bits[3]);
  }
};

// Lowers Expr bodies into alternatives of symbols (see grammar.h).
class Lowerer {
 public:
  explicit Lowerer(std::vector<Grammar::Rule>* rules) : rules_(*rules) {
    for (size_t i = 0; i < rules_.size(); ++i) index_[rules_[i].name] = static_cast<int32_t>(i);
    num_named_ = rules_.size();
  }

  std::vector<ByteSet> TakeByteSets() { return std::move(byte_sets_); }
  size_t num_named() const { return num_named_; }
  // Per named rule: the tokens its body names (helpers included).
  std::vector<std::vector<std::string>> TakeTokenNames() { return std::move(token_names_); }

  absl::Status LowerRule(int32_t rule, const Expr& body) {
    current_ = rules_[rule].name;
    current_index_ = rule;
    helpers_ = 0;
    return LowerInto(rule, body, 0);
  }

 private:
  // Sets rules_[rule].alternatives from `body`.
  absl::Status LowerInto(int32_t rule, const Expr& body, int depth) {
    std::vector<std::vector<Symbol>> alts;
    if (body.kind == Expr::Kind::kChoice) {
      for (const Expr& child : body.children) {
        std::vector<Symbol> seq;
        if (absl::Status s = LowerItem(child, &seq, depth + 1); !s.ok()) return s;
        alts.push_back(std::move(seq));
      }
    } else {
      std::vector<Symbol> seq;
      if (absl::Status s = LowerItem(body, &seq, depth + 1); !s.ok()) return s;
      alts.push_back(std::move(seq));
    }
    for (const auto& a : alts) symbols_ += a.size() + 1;
    if (symbols_ > kMaxGrammarSymbols) {
      return Error(body.pos, current_,
                   absl::StrCat("the grammar is larger than ", kMaxGrammarSymbols, " symbols after lowering"));
    }
    rules_[rule].alternatives = std::move(alts);
    return absl::OkStatus();
  }

  int32_t NewHelper(const SourcePos& pos) {
    Grammar::Rule r;
    r.name = absl::StrCat(current_, "#", ++helpers_);
    r.pos = pos;
    rules_.push_back(std::move(r));
    return static_cast<int32_t>(rules_.size() - 1);
  }

  int32_t ByteSetIndex(const ByteSet& set) {
    auto [it, inserted] = byte_set_index_.try_emplace(set, static_cast<int32_t>(byte_sets_.size()));
    if (inserted) byte_sets_.push_back(set);
    return it->second;
  }

  Symbol ByteTerminal(uint8_t b) {
    ByteSet s;
    s.Add(b);
    return Symbol::Terminal(ByteSetIndex(s));
  }

  absl::Status LowerClass(const Expr& e, std::vector<Symbol>* out) {
    const std::vector<CodepointRange> ranges = NormalizeClass(e.ranges, e.negated);
    const std::vector<Utf8ByteRanges> seqs = Utf8Sequences(ranges);
    if (seqs.empty()) {
      out->push_back(Symbol::Terminal(ByteSetIndex(ByteSet{})));  // never matches
      return absl::OkStatus();
    }
    bool single_byte = true;
    for (const Utf8ByteRanges& s : seqs) single_byte = single_byte && s.length == 1;
    const auto terminal = [&](uint8_t lo, uint8_t hi) {
      ByteSet set;
      set.AddRange(lo, hi);
      return Symbol::Terminal(ByteSetIndex(set));
    };
    if (single_byte) {
      ByteSet set;
      for (const Utf8ByteRanges& s : seqs) set.AddRange(s.lo[0], s.hi[0]);
      out->push_back(Symbol::Terminal(ByteSetIndex(set)));
      return absl::OkStatus();
    }
    const int32_t h = NewHelper(e.pos);
    std::vector<std::vector<Symbol>> alts;
    ByteSet ascii;
    for (const Utf8ByteRanges& s : seqs) {
      if (s.length == 1) {
        ascii.AddRange(s.lo[0], s.hi[0]);
        continue;
      }
      std::vector<Symbol> seq;
      for (int i = 0; i < s.length; ++i) seq.push_back(terminal(s.lo[i], s.hi[i]));
      alts.push_back(std::move(seq));
    }
    if (!ascii.Empty()) alts.insert(alts.begin(), {Symbol::Terminal(ByteSetIndex(ascii))});
    for (const auto& a : alts) symbols_ += a.size() + 1;
    rules_[h].alternatives = std::move(alts);
    out->push_back(Symbol::Rule(h));
    return absl::OkStatus();
  }

  // `e` as exactly one symbol (a helper rule unless it lowers to one symbol).
  absl::StatusOr<Symbol> AsSymbol(const Expr& e, int depth) {
    if (e.kind != Expr::Kind::kChoice) {
      std::vector<Symbol> seq;
      if (absl::Status s = LowerItem(e, &seq, depth + 1); !s.ok()) return s;
      if (seq.size() == 1) return seq[0];
      const int32_t h = NewHelper(e.pos);
      symbols_ += seq.size() + 1;
      rules_[h].alternatives.push_back(std::move(seq));
      return Symbol::Rule(h);
    }
    const int32_t h = NewHelper(e.pos);
    if (absl::Status s = LowerInto(h, e, depth + 1); !s.ok()) return s;
    return Symbol::Rule(h);
  }

  absl::Status LowerRepeat(const Expr& e, std::vector<Symbol>* out, int depth) {
    if (e.min < 0 || e.min > kMaxRepetition || e.max > kMaxRepetition || (e.max >= 0 && e.max < e.min)) {
      return Error(e.pos, current_,
                   absl::StrCat("repetition {", e.min, ",", e.max < 0 ? std::string() : absl::StrCat(e.max),
                                "} is out of order or above ", kMaxRepetition));
    }
    if (e.max == 0) return absl::OkStatus();
    absl::StatusOr<Symbol> x = AsSymbol(e.children[0], depth);
    if (!x.ok()) return x.status();
    const int copies = e.max < 0 ? std::max(e.min - 1, 0) : e.min;
    for (int i = 0; i < copies; ++i) out->push_back(*x);
    symbols_ += copies;
    if (e.max < 0) {
      // h ::= "" | h X (star) or h ::= X | h X (plus, carrying the last required copy).
      const int32_t h = NewHelper(e.pos);
      const Symbol self = Symbol::Rule(h);
      std::vector<Symbol> base;
      if (e.min > 0) base.push_back(*x);
      rules_[h].alternatives = {std::move(base), {self, *x}};
      symbols_ += 5;
      out->push_back(self);
    } else if (e.max > e.min) {
      // T1 ::= "" | X;  Tj ::= "" | X T(j-1).
      Symbol inner{};
      for (int j = 1; j <= e.max - e.min; ++j) {
        const int32_t t = NewHelper(e.pos);
        std::vector<Symbol> seq = {*x};
        if (j > 1) seq.push_back(inner);
        rules_[t].alternatives = {{}, std::move(seq)};
        rules_[t].repeat_remaining = j;
        symbols_ += 4;
        inner = Symbol::Rule(t);
      }
      out->push_back(inner);
    }
    if (symbols_ > kMaxGrammarSymbols) {
      return Error(e.pos, current_,
                   absl::StrCat("the grammar is larger than ", kMaxGrammarSymbols, " symbols after lowering"));
    }
    return absl::OkStatus();
  }

  absl::Status LowerItem(const Expr& e, std::vector<Symbol>* out, int depth) {
    if (depth > kMaxNesting) return Error(e.pos, current_, absl::StrCat("nesting deeper than ", kMaxNesting));
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return absl::OkStatus();
      case Expr::Kind::kLiteral:
        if (HoldsMarkerByte(e.text)) {
          return Error(e.pos, current_, "a literal holds byte 0xFE or 0xFF (kept for token markers)");
        }
        for (char c : e.text) out->push_back(ByteTerminal(static_cast<uint8_t>(c)));
        symbols_ += e.text.size();
        return absl::OkStatus();
      case Expr::Kind::kToken: {
        if (e.text.empty() || HoldsMarkerByte(e.text)) {
          return Error(e.pos, current_, "a token's name must be non-empty UTF-8 text");
        }
        if (token_names_.size() <= static_cast<size_t>(current_index_)) token_names_.resize(current_index_ + 1);
        token_names_[current_index_].push_back(e.text);
        const std::string marker = TokenMarker(e.text);
        for (char c : marker) out->push_back(ByteTerminal(static_cast<uint8_t>(c)));
        symbols_ += marker.size();
        return absl::OkStatus();
      }
      case Expr::Kind::kClass:
        return LowerClass(e, out);
      case Expr::Kind::kRule: {
        auto it = index_.find(e.text);
        if (it == index_.end()) return Error(e.pos, current_, absl::StrCat("undefined rule '", e.text, "'"));
        out->push_back(Symbol::Rule(it->second));
        return absl::OkStatus();
      }
      case Expr::Kind::kSequence:
        for (const Expr& c : e.children) {
          if (absl::Status s = LowerItem(c, out, depth + 1); !s.ok()) return s;
        }
        return absl::OkStatus();
      case Expr::Kind::kChoice: {
        absl::StatusOr<Symbol> s = AsSymbol(e, depth);
        if (!s.ok()) return s.status();
        out->push_back(*s);
        return absl::OkStatus();
      }
      case Expr::Kind::kRepeat:
        return LowerRepeat(e, out, depth);
    }
    return absl::OkStatus();
  }

  std::vector<Grammar::Rule>& rules_;
  absl::flat_hash_map<std::string, int32_t> index_;
  size_t num_named_ = 0;
  std::vector<ByteSet> byte_sets_;
  absl::flat_hash_map<ByteSet, int32_t, ByteSetHash> byte_set_index_;
  std::string current_;
  int32_t current_index_ = 0;
  std::vector<std::vector<std::string>> token_names_;
  int helpers_ = 0;
  size_t symbols_ = 0;
};

}  // namespace

absl::StatusOr<Grammar> GrammarBuilder::Build(std::string_view root) && {
  std::vector<Grammar::Rule> rules;
  absl::flat_hash_map<std::string, size_t> seen;
  for (PendingRule& r : rules_) {
    if (auto it = seen.find(r.name); it != seen.end()) {
      return Error(r.pos, r.name,
                   absl::StrCat("defined twice (first at ", rules_[it->second].pos.ToString(), ")"));
    }
    seen[r.name] = rules.size();
    rules.push_back({r.name, r.pos, {}});
  }
  auto root_it = seen.find(std::string(root));
  if (root_it == seen.end()) {
    return absl::InvalidArgumentError(absl::StrCat("grammar: no root rule '", std::string(root), "'"));
  }
  Lowerer lowerer(&rules);
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (absl::Status s = lowerer.LowerRule(static_cast<int32_t>(i), rules_[i].body); !s.ok()) return s;
  }
  std::vector<ByteSet> byte_sets = lowerer.TakeByteSets();
  const size_t num_named = lowerer.num_named();
  std::vector<std::vector<std::string>> token_names = lowerer.TakeTokenNames();
  const size_t n = rules.size();

  // Productive rules: a fixpoint over alternatives whose symbols are all productive.
  std::vector<char> productive(n, 0);
  const auto symbol_ok = [&](Symbol s) {
    return s.is_rule() ? productive[s.rule()] != 0 : !byte_sets[s.byte_set()].Empty();
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (productive[r]) continue;
      for (const auto& alt : rules[r].alternatives) {
        if (std::all_of(alt.begin(), alt.end(), symbol_ok)) {
          productive[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  const int32_t root_index = static_cast<int32_t>(root_it->second);
  const auto reach = [&](std::vector<char>* reachable) {
    reachable->assign(n, 0);
    std::vector<int32_t> stack = {root_index};
    (*reachable)[root_index] = 1;
    while (!stack.empty()) {
      const int32_t r = stack.back();
      stack.pop_back();
      for (const auto& alt : rules[r].alternatives) {
        for (Symbol s : alt) {
          if (s.is_rule() && !(*reachable)[s.rule()]) {
            (*reachable)[s.rule()] = 1;
            stack.push_back(s.rule());
          }
        }
      }
    }
  };
  std::vector<char> reachable;
  reach(&reachable);
  if (!productive[root_index]) {
    return Error(rules[root_index].pos, rules[root_index].name, "the grammar matches nothing");
  }
  // A named rule in use that derives no finite string is a mistake in the grammar
  // ("a ::= "x" a"); helper rules that match nothing (an empty class) only lose the
  // alternatives that use them.
  for (size_t r = 0; r < num_named; ++r) {
    if (reachable[r] && !productive[r]) {
      return Error(rules[r].pos, rules[r].name, "derives no finite string (it can never match)");
    }
  }
  for (Grammar::Rule& r : rules) {
    std::erase_if(r.alternatives, [&](const std::vector<Symbol>& alt) {
      return !std::all_of(alt.begin(), alt.end(), symbol_ok);
    });
  }
  reach(&reachable);
  Grammar g;
  for (size_t r = 0; r < token_names.size(); ++r) {
    if (!reachable[r]) continue;
    for (std::string& name : token_names[r]) g.token_names_.push_back(std::move(name));
  }
  std::sort(g.token_names_.begin(), g.token_names_.end());
  g.token_names_.erase(std::unique(g.token_names_.begin(), g.token_names_.end()), g.token_names_.end());
  std::vector<int32_t> renumber(n, -1);
  for (size_t r = 0; r < n; ++r) {
    if (!reachable[r]) {
      if (r < num_named) {
        if (!productive[r]) {
          g.warnings_.push_back(absl::StrCat("rule '", rules[r].name, "' derives no finite string and is unused"));
        } else {
          g.warnings_.push_back(absl::StrCat("rule '", rules[r].name, "' is unreachable from '", std::string(root), "'"));
        }
      }
      continue;
    }
    renumber[r] = static_cast<int32_t>(g.rules_.size());
    g.rules_.push_back(std::move(rules[r]));
  }
  for (Grammar::Rule& r : g.rules_) {
    for (auto& alt : r.alternatives) {
      for (Symbol& s : alt) {
        if (s.is_rule()) s = Symbol::Rule(renumber[s.rule()]);
      }
    }
  }
  g.root_ = renumber[root_index];
  // Byte sets: keep only the non-empty ones that are used, renumbered.
  std::vector<int32_t> set_renumber(byte_sets.size(), -1);
  for (Grammar::Rule& r : g.rules_) {
    for (auto& alt : r.alternatives) {
      for (Symbol& s : alt) {
        if (s.is_rule()) continue;
        int32_t& to = set_renumber[s.byte_set()];
        if (to < 0) {
          to = static_cast<int32_t>(g.byte_sets_.size());
          g.byte_sets_.push_back(byte_sets[s.byte_set()]);
        }
        s = Symbol::Terminal(to);
      }
    }
  }
  return g;
}

}  // namespace tandem::grammar
