// Test helper: whether a grammar's language holds a byte string, by the Earley
// recognizer fed byte by byte.
#pragma once

#include <string_view>

#include "engine/grammar/earley_recognizer.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/rule_table.h"

namespace tandem::grammar::testing {

inline bool Recognizes(const RuleTable& table, std::string_view bytes) {
  EarleyRecognizer r(table);
  r.ResetToStart();
  for (char c : bytes) {
    if (!r.Push(static_cast<uint8_t>(c))) return false;
  }
  return r.CanEnd();
}

inline bool Recognizes(const Grammar& g, std::string_view bytes) {
  const RuleTable table = RuleTable::Build(g);
  return Recognizes(table, bytes);
}

}  // namespace tandem::grammar::testing
