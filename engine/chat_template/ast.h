// The parsed form of a template: expressions and statements as Jinja2's parser builds
// them, each with the byte offset it starts at (for error positions).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_template/value.h"

namespace tandem::chat_template_internal {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
using KeywordArgs = std::vector<std::pair<std::string, ExprPtr>>;

enum class ExprType {
  kLiteral,  // literal
  kName,     // name
  kList,     // items
  kTuple,    // items
  kDict,     // items: key, value, key, value, ...
  kGetAttr,  // a.name (also x.0, stored as kGetItem)
  kGetItem,  // a[b]
  kSlice,    // a[b:c:d], each of b, c, d optional
  kCall,     // a(items..., kwargs...)
  kFilter,   // a|name(items..., kwargs...); a is null in a filter block's or block set's chain
  kTest,     // a is [not] name(items..., kwargs...)
  kNot,      // not a
  kNeg,      // -a
  kPos,      // +a
  kBinary,   // a name b: + - * / // % **
  kConcat,   // items joined with ~
  kCompare,  // a (ops[i].first ops[i].second)...: == != < <= > >= in notin
  kAnd,      // a and b
  kOr,       // a or b
  kCond,     // b if a else c (c null: Undefined)
};

struct Expr {
  ExprType type;
  size_t offset = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> items;
  KeywordArgs kwargs;
  ExprPtr a, b, c, d;
  std::vector<std::pair<std::string, ExprPtr>> ops;
  bool negated = false;
};

enum class StmtType {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches (condition, body); else_body
  kFor,          // for targets in expr [if cond]: body; else_body
  kSet,          // set targets = expr; set targets[0].attr = expr
  kSetBlock,     // set targets[0] [| filter]: body
  kMacro,        // macro
  kFilterBlock,  // filter chain: body
  kBreak,
  kContinue,
  kScope,  // body rendered in place ({% generation %}, which transformers defines)
};

struct MacroStmt {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // defaults[i] for params[i], null when it has none
  Body body;
};

struct Stmt {
  StmtType type;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string attr;  // set ns.attr = ...
  ExprPtr filter;    // kSetBlock / kFilterBlock: a kFilter chain whose innermost input is null
  std::unique_ptr<MacroStmt> macro;
};

}  // namespace tandem::chat_template_internal
