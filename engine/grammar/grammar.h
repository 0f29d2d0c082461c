// The grammar IR every structured-output front end (EBNF, regex, JSON schema) produces and
// the matcher consumes: a context-free grammar over bytes.
//
// Front ends describe rules with `Expr` trees (literals, character classes over Unicode
// code points, rule references, sequences, alternatives, repetitions) and hand them to a
// GrammarBuilder. Build() validates and lowers them into a `Grammar`: rules whose bodies
// are alternatives of sequences of symbols, each symbol a rule or a byte-set terminal
// (one byte out of a set of 256). Lowering:
//   - a literal becomes one terminal per byte;
//   - a character class becomes the UTF-8 encodings of its code points, as alternatives
//     of one to four byte-set terminals (in a helper rule unless every code point is one
//     byte); a negated class and `.` are classes too (surrogates are never matched:
//     they have no UTF-8 encoding);
//   - nested groups become helper rules;
//   - X* becomes h ::= "" | h X, X+ becomes h ::= X | h X (left recursion: the Earley
//     recognizer handles it in constant work per byte, where right recursion would cost
//     work proportional to the repetition's length); X? becomes h ::= "" | X; X{m,n}
//     becomes m copies of X followed by n - m nested optional copies (or X* when n is
//     unbounded);
//   - a token terminal (a special or added token named by its content, e.g. DeepSeek's
//     <｜tool▁calls▁begin｜>) becomes the bytes of its marker (TokenMarker): 0xFF, the
//     name, 0xFE. No UTF-8 text holds those two bytes, and the vocabulary gives them to
//     nothing but that token (vocabulary.h), so text never produces a special token and
//     a special token is allowed exactly where a grammar names it.
// Helper rules are named after their rule with a suffix ("value#3").
//
// Validation (each error INVALID_ARGUMENT, naming the rule and its source position):
//   - a reference to a rule that is not defined, a rule defined twice, a missing root;
//   - a rule that derives no finite string ("a ::= "x" a"), or a grammar whose root
//     matches nothing (an empty class, say); alternatives that can never match (they
//     contain an empty class or such a rule) are dropped when the rule keeps others;
//   - repetition bounds out of order or above kMaxRepetition, and grammars larger than
//     kMaxGrammarSymbols symbols after lowering (hostile inputs fail instead of
//     exhausting memory);
//   - a literal holding a marker byte (0xFE, 0xFF), a token terminal with an empty name
//     or one holding them.
// Whether the vocabulary has the named tokens is checked when the grammar is compiled
// against it (compiled_grammar.h).
// Rules that the root cannot reach are dropped and reported in Grammar::warnings(), not
// refused: a grammar file may keep helper rules it does not use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::grammar {

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
// Largest m or n in X{m,n}.
inline constexpr int kMaxRepetition = 100000;
// Largest grammar after lowering, in symbols (terminals and references) over all rules.
inline constexpr size_t kMaxGrammarSymbols = size_t{1} << 21;

// Where a piece of a grammar comes from, for error messages: a line and column of an
// EBNF file, an offset in a regex (line 0), or a description such as a JSON pointer.
struct SourcePos {
  int line = 0;    // 1-based; 0 when `where` or the offset says it instead
  int column = 0;  // 1-based line column, or 1-based offset in a one-line source
  std::string where;
  std::string ToString() const;
};

// An inclusive range of Unicode code points.
struct CodepointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
  bool operator==(const CodepointRange&) const = default;
};

// A node of a rule body as front ends write it.
struct Expr {
  enum class Kind {
    kEmpty,     // matches the empty string
    kLiteral,   // `text`, bytes as they are (UTF-8 for text)
    kClass,     // one code point in `ranges` (or, negated, not in them)
    kRule,      // a reference to rule `text`
    kSequence,  // children one after another
    kChoice,    // one of children
    kRepeat,    // children[0] between min and max times (max -1: unbounded)
    kToken,     // the special or added token whose content is `text`
  };
  Kind kind = Kind::kEmpty;
  std::string text;
  std::vector<CodepointRange> ranges;
  bool negated = false;
  std::vector<Expr> children;
  int min = 0;
  int max = -1;
  SourcePos pos;

  static Expr Empty(SourcePos pos = {});
  static Expr Literal(std::string_view bytes, SourcePos pos = {});
  static Expr Class(std::vector<CodepointRange> ranges, bool negated, SourcePos pos = {});
  static Expr Char(uint32_t cp, SourcePos pos = {});
  static Expr AnyChar(SourcePos pos = {});  // any code point
  static Expr Ref(std::string_view rule, SourcePos pos = {});
  static Expr Token(std::string_view name, SourcePos pos = {});
  static Expr Sequence(std::vector<Expr> children, SourcePos pos = {});
  static Expr Choice(std::vector<Expr> children, SourcePos pos = {});
  static Expr Repeat(Expr child, int min, int max, SourcePos pos = {});
  static Expr Optional(Expr child, SourcePos pos = {}) { return Repeat(std::move(child), 0, 1, std::move(pos)); }
  static Expr Star(Expr child, SourcePos pos = {}) { return Repeat(std::move(child), 0, -1, std::move(pos)); }
  static Expr Plus(Expr child, SourcePos pos = {}) { return Repeat(std::move(child), 1, -1, std::move(pos)); }

 private:
  static Expr WithText(Kind kind, std::string_view text, SourcePos pos);  // literal, rule, token
};

// A token terminal's bytes in a grammar and in the vocabulary's trie.
inline constexpr uint8_t kTokenMarkerOpen = 0xFF;
inline constexpr uint8_t kTokenMarkerClose = 0xFE;
std::string TokenMarker(std::string_view name);
// Whether `bytes` hold kTokenMarkerOpen or kTokenMarkerClose.
bool HoldsMarkerByte(std::string_view bytes);

// The code points of `ranges` (or of their complement, when `negated`), sorted, merged,
// without surrogates.
std::vector<CodepointRange> NormalizeClass(std::vector<CodepointRange> ranges, bool negated);

// 256 bits: which bytes a terminal accepts.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Contains(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi);
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

// A symbol of a lowered rule: a rule reference (value >= 0, the rule's index) or a
// terminal (value < 0: byte set number ~value).
struct Symbol {
  int32_t value = 0;
  static Symbol Rule(int32_t rule) { return {rule}; }
  static Symbol Terminal(int32_t byte_set) { return {~byte_set}; }
  bool is_rule() const { return value >= 0; }
  int32_t rule() const { return value; }
  int32_t byte_set() const { return ~value; }
  bool operator==(const Symbol&) const = default;
};

// A validated grammar: every rule reachable from the root and productive (it derives at
// least one finite byte string); every alternative can match.
class Grammar {
 public:
  struct Rule {
    std::string name;
    SourcePos pos;
    std::vector<std::vector<Symbol>> alternatives;
    // For the rules a bounded repetition X{m,n} lowers to (T1 ::= "" | X, Tj ::= "" |
    // X T(j-1)): j, how many more copies of X it allows; 0 for every other rule. Lets the
    // precomputation treat chains deeper than any token alike (rule_table.h).
    int32_t repeat_remaining = 0;
  };

  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  int32_t root() const { return root_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The names of the tokens that rules reachable from the root use, sorted.
  const std::vector<std::string>& token_names() const { return token_names_; }
  size_t num_symbols() const;
  // EBNF-like text of the lowered grammar (one rule per line), for debugging and tests.
  std::string ToString() const;

 private:
  friend class GrammarBuilder;
  std::vector<Rule> rules_;
  std::vector<ByteSet> byte_sets_;
  int32_t root_ = 0;
  std::vector<std::string> warnings_;
  std::vector<std::string> token_names_;
};

// Collects rules, then validates and lowers them (see the top of this file).
class GrammarBuilder {
 public:
  void AddRule(std::string name, Expr body, SourcePos pos = {});
  bool HasRule(std::string_view name) const;
  // Errors: INVALID_ARGUMENT as listed at the top of this file.
  absl::StatusOr<Grammar> Build(std::string_view root) &&;

 private:
  struct PendingRule {
    std::string name;
    Expr body;
    SourcePos pos;
  };
  std::vector<PendingRule> rules_;
};

}  // namespace tandem::grammar
