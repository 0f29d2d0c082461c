#include "engine/chat_template/parser.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {
namespace {

ExprPtr NewExpr(ExprType type, size_t offset) {
  auto e = std::make_unique<Expr>();
  e->type = type;
  e->offset = offset;
  return e;
}

StmtPtr NewStmt(StmtType type, size_t offset) {
  auto s = std::make_unique<Stmt>();
  s->type = type;
  s->offset = offset;
  return s;
}

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kText:
      return "template data";
    case TokenType::kVarBegin:
      return "begin of print statement";
    case TokenType::kVarEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kName:
      return t.value;
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOp:
      return t.value;
    case TokenType::kEnd:
      return "end of template";
  }
  return "token";
}

class Parser {
 public:
  Parser(std::string_view src, std::vector<Token> tokens) : src_(src), tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &body, &end));
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == TokenType::kOp && Cur().value == op; }
  bool IsName(std::string_view name) const { return Cur().type == TokenType::kName && Cur().value == name; }

  absl::Status Fail(size_t offset, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Position(src_, offset), ": ", std::string(what)));
  }
  absl::Status Unexpected(std::string_view expected) const {
    return Fail(Cur().offset, absl::StrCat("expected ", std::string(expected), ", got '", Describe(Cur()), "'"));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", std::string(op), "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Unexpected("a name");
    std::string name = Cur().value;
    Next();
    return name;
  }

  // Guards every recursive descent: nesting past kMaxParseDepth is an error.
  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) { ++p->depth_; }
    ~DepthGuard() { --p->depth_; }
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxParseDepth) return Fail(Cur().offset, "template nested too deeply");
    return absl::OkStatus();
  }
  // Operator chains (a + b + c, a.b.c, a|f|g) build trees as deep as they are long:
  // each link counts against the same bound as nesting.
  absl::Status Link(int* links) const {
    if (++*links + depth_ > kMaxParseDepth) return Fail(Cur().offset, "expression too long or nested too deeply");
    return absl::OkStatus();
  }

  // ---- statements ----

  // Statements until `{% <one of ends>`, whose name is consumed and returned in *found.
  absl::Status ParseBody(std::initializer_list<std::string_view> ends, Body* out, std::string* found) {
    DepthGuard guard(this);
    RETURN_IF_ERROR(CheckDepth());
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kText: {
          StmtPtr s = NewStmt(StmtType::kText, t.offset);
          s->text = t.value;
          out->push_back(std::move(s));
          Next();
          break;
        }
        case TokenType::kVarBegin: {
          StmtPtr s = NewStmt(StmtType::kOutput, t.offset);
          Next();
          ASSIGN_OR_RETURN(s->expr, ParseTuple(true, false));
          if (Cur().type != TokenType::kVarEnd) return Unexpected("end of print statement");
          Next();
          out->push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& name = Peek();
          if (name.type != TokenType::kName) return Fail(name.offset, "tag name expected");
          for (std::string_view end : ends) {
            if (name.value == end) {
              *found = name.value;
              Next();
              Next();
              return absl::OkStatus();
            }
          }
          Next();
          RETURN_IF_ERROR(ParseStatement(out));
          break;
        }
        case TokenType::kEnd: {
          if (ends.size() == 0) return absl::OkStatus();
          std::string wanted;
          for (std::string_view end : ends)
            absl::StrAppend(&wanted, wanted.empty() ? "'" : " or '", std::string(end), "'");
          return Fail(t.offset, absl::StrCat("unexpected end of template; looking for the tags ", wanted));
        }
        default:
          return Fail(t.offset, absl::StrCat("unexpected '", Describe(t), "'"));
      }
    }
  }

  // At the tag name after `{%`.
  absl::Status ParseStatement(Body* out) {
    const Token& t = Cur();
    const std::string& name = t.value;
    if (name == "if") return ParseIf(out);
    if (name == "for") return ParseFor(out);
    if (name == "set") return ParseSet(out);
    if (name == "macro") return ParseMacro(out);
    if (name == "filter") return ParseFilterBlock(out);
    if (name == "generation") {
      // transformers' AssistantTracker extension: the body renders as is.
      StmtPtr s = NewStmt(StmtType::kScope, t.offset);
      Next();
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      RETURN_IF_ERROR(ParseBody({"endgeneration"}, &s->body, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Fail(t.offset, absl::StrCat("'", name, "' outside of a loop"));
      StmtPtr s = NewStmt(name == "break" ? StmtType::kBreak : StmtType::kContinue, t.offset);
      Next();
      RETURN_IF_ERROR(ExpectBlockEnd());
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    for (std::string_view unsupported :
         {"include", "import", "from", "extends", "block", "call", "raw", "with", "autoescape", "do"}) {
      if (name == unsupported) return Fail(t.offset, absl::StrCat("the '", name, "' tag is not supported"));
    }
    return Fail(t.offset, absl::StrCat("encountered unknown tag '", name, "'"));
  }

  absl::Status ParseIf(Body* out) {
    StmtPtr s = NewStmt(StmtType::kIf, Cur().offset);
    Next();
    ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false));
    RETURN_IF_ERROR(ExpectBlockEnd());
    while (true) {
      Body body;
      std::string end;
      RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end));
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        ASSIGN_OR_RETURN(cond, ParseTuple(false, false));
        RETURN_IF_ERROR(ExpectBlockEnd());
        continue;
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      if (end == "else") {
        RETURN_IF_ERROR(ParseBody({"endif"}, &s->else_body, &end));
        RETURN_IF_ERROR(ExpectBlockEnd());
      }
      break;
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  // Names of an assignment target: `a`, `a, b` or `(a, b)`.
  absl::Status ParseTargetNames(std::vector<std::string>* names) {
    const bool parens = IsOp("(");
    if (parens) Next();
    while (true) {
      ASSIGN_OR_RETURN(std::string n, ExpectName());
      names->push_back(std::move(n));
      if (!IsOp(",")) break;
      Next();
      if (Cur().type != TokenType::kName) break;  // a trailing comma
    }
    if (parens) RETURN_IF_ERROR(ExpectOp(")"));
    return absl::OkStatus();
  }

  absl::Status ParseFor(Body* out) {
    StmtPtr s = NewStmt(StmtType::kFor, Cur().offset);
    Next();
    RETURN_IF_ERROR(ParseTargetNames(&s->targets));
    if (!IsName("in")) return Unexpected("'in'");
    Next();
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false));
    if (IsName("if")) {
      Next();
      ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
    }
    if (IsName("recursive")) return Fail(Cur().offset, "recursive loops are not supported");
    RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    std::string end;
    absl::Status st = ParseBody({"endfor", "else"}, &s->body, &end);
    --loop_depth_;
    RETURN_IF_ERROR(st);
    RETURN_IF_ERROR(ExpectBlockEnd());
    if (end == "else") {
      RETURN_IF_ERROR(ParseBody({"endfor"}, &s->else_body, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseSet(Body* out) {
    const size_t offset = Cur().offset;
    Next();
    std::vector<std::string> targets;
    std::string attr;
    if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().value == ".") {
      targets.push_back(Cur().value);
      Next();
      Next();
      ASSIGN_OR_RETURN(attr, ExpectName());
    } else {
      RETURN_IF_ERROR(ParseTargetNames(&targets));
    }
    if (IsOp("=")) {
      Next();
      StmtPtr s = NewStmt(StmtType::kSet, offset);
      s->targets = std::move(targets);
      s->attr = std::move(attr);
      ASSIGN_OR_RETURN(s->expr, ParseTuple(true, false));
      RETURN_IF_ERROR(ExpectBlockEnd());
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    if (targets.size() != 1 || !attr.empty()) return Fail(offset, "a block set assigns one name");
    StmtPtr s = NewStmt(StmtType::kSetBlock, offset);
    s->targets = std::move(targets);
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(s->filter, ParseFilter(nullptr, false));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    RETURN_IF_ERROR(ParseBody({"endset"}, &s->body, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseMacro(Body* out) {
    StmtPtr s = NewStmt(StmtType::kMacro, Cur().offset);
    Next();
    auto m = std::make_unique<MacroStmt>();
    ASSIGN_OR_RETURN(m->name, ExpectName());
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!m->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      const size_t at = Cur().offset;
      ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr def;
      if (IsOp("=")) {
        Next();
        ASSIGN_OR_RETURN(def, ParseExpression(true));
      } else if (!m->defaults.empty() && m->defaults.back() != nullptr) {
        return Fail(at, "non-default argument follows default argument");
      }
      m->params.push_back(std::move(param));
      m->defaults.push_back(std::move(def));
    }
    Next();
    RETURN_IF_ERROR(ExpectBlockEnd());
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    absl::Status st = ParseBody({"endmacro"}, &m->body, &end);
    loop_depth_ = saved_loop_depth;
    RETURN_IF_ERROR(st);
    RETURN_IF_ERROR(ExpectBlockEnd());
    s->macro = std::move(m);
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseFilterBlock(Body* out) {
    StmtPtr s = NewStmt(StmtType::kFilterBlock, Cur().offset);
    Next();
    ASSIGN_OR_RETURN(s->filter, ParseFilter(nullptr, true));
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    RETURN_IF_ERROR(ParseBody({"endfilter"}, &s->body, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  // ---- expressions ----

  bool AtTupleEnd() const {
    const Token& t = Cur();
    return t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd ||
           (t.type == TokenType::kOp && t.value == ")");
  }

  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
    const size_t offset = Cur().offset;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (AtTupleEnd()) break;
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens)
        return Fail(Cur().offset, absl::StrCat("expected an expression, got '", Describe(Cur()), "'"));
    }
    ExprPtr t = NewExpr(ExprType::kTuple, offset);
    t->items = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    RETURN_IF_ERROR(CheckDepth());
    if (!with_condexpr) return ParseOr();
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    int links = 0;
    while (IsName("if")) {
      RETURN_IF_ERROR(Link(&links));
      const size_t offset = Cur().offset;
      Next();
      ExprPtr cond = NewExpr(ExprType::kCond, offset);
      ASSIGN_OR_RETURN(cond->a, ParseOr());
      cond->b = std::move(expr);
      if (IsName("else")) {
        Next();
        ASSIGN_OR_RETURN(cond->c, ParseExpression(true));
      }
      expr = std::move(cond);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    int links = 0;
    while (IsName("or")) {
      RETURN_IF_ERROR(Link(&links));
      ExprPtr e = NewExpr(ExprType::kOr, Cur().offset);
      Next();
      e->a = std::move(left);
      ASSIGN_OR_RETURN(e->b, ParseAnd());
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    int links = 0;
    while (IsName("and")) {
      RETURN_IF_ERROR(Link(&links));
      ExprPtr e = NewExpr(ExprType::kAnd, Cur().offset);
      Next();
      e->a = std::move(left);
      ASSIGN_OR_RETURN(e->b, ParseNot());
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      RETURN_IF_ERROR(CheckDepth());
      ExprPtr e = NewExpr(ExprType::kNot, Cur().offset);
      Next();
      ASSIGN_OR_RETURN(e->a, ParseNot());
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const size_t offset = Cur().offset;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<std::pair<std::string, ExprPtr>> ops;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp && (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
                                           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath1());
      ops.emplace_back(std::move(op), std::move(rhs));
    }
    if (ops.empty()) return first;
    ExprPtr e = NewExpr(ExprType::kCompare, offset);
    e->a = std::move(first);
    e->ops = std::move(ops);
    return e;
  }

  absl::StatusOr<ExprPtr> Binary(ExprPtr left, std::string op, size_t offset, ExprPtr right) {
    ExprPtr e = NewExpr(ExprType::kBinary, offset);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    int links = 0;
    while (IsOp("+") || IsOp("-")) {
      RETURN_IF_ERROR(Link(&links));
      const std::string op = Cur().value;
      const size_t offset = Cur().offset;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      ASSIGN_OR_RETURN(left, Binary(std::move(left), op, offset, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const size_t offset = Cur().offset;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    ExprPtr e = NewExpr(ExprType::kConcat, offset);
    e->items.push_back(std::move(first));
    while (IsOp("~")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      e->items.push_back(std::move(next));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    int links = 0;
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      RETURN_IF_ERROR(Link(&links));
      const std::string op = Cur().value;
      const size_t offset = Cur().offset;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      ASSIGN_OR_RETURN(left, Binary(std::move(left), op, offset, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    int links = 0;
    while (IsOp("**")) {
      RETURN_IF_ERROR(Link(&links));
      const size_t offset = Cur().offset;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      ASSIGN_OR_RETURN(left, Binary(std::move(left), "**", offset, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    RETURN_IF_ERROR(CheckDepth());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = NewExpr(IsOp("-") ? ExprType::kNeg : ExprType::kPos, Cur().offset);
      Next();
      ASSIGN_OR_RETURN(node->a, ParseUnary(false));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    switch (t.type) {
      case TokenType::kName: {
        ExprPtr e;
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          e = NewExpr(ExprType::kLiteral, t.offset);
          e->literal = Value::Bool(t.value == "true" || t.value == "True");
        } else if (t.value == "none" || t.value == "None") {
          e = NewExpr(ExprType::kLiteral, t.offset);
          e->literal = Value::None();
        } else {
          e = NewExpr(ExprType::kName, t.offset);
          e->name = t.value;
        }
        Next();
        return e;
      }
      case TokenType::kString: {
        ExprPtr e = NewExpr(ExprType::kLiteral, t.offset);
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Next();
        }
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenType::kInteger:
      case TokenType::kFloat: {
        ExprPtr e = NewExpr(ExprType::kLiteral, t.offset);
        e->literal = t.type == TokenType::kInteger ? Value::Int(t.int_value) : Value::Float(t.float_value);
        Next();
        return e;
      }
      case TokenType::kOp:
        if (t.value == "(") {
          Next();
          ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, true));
          RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.value == "[") return ParseList();
        if (t.value == "{") return ParseDict();
        break;
      default:
        break;
    }
    return Fail(t.offset, absl::StrCat("unexpected '", Describe(t), "'"));
  }

  absl::StatusOr<ExprPtr> ParseList() {
    ExprPtr e = NewExpr(ExprType::kList, Cur().offset);
    Next();
    while (!IsOp("]")) {
      if (!e->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      e->items.push_back(std::move(item));
    }
    Next();
    return e;
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    ExprPtr e = NewExpr(ExprType::kDict, Cur().offset);
    Next();
    while (!IsOp("}")) {
      if (!e->items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      RETURN_IF_ERROR(ExpectOp(":"));
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->items.push_back(std::move(key));
      e->items.push_back(std::move(value));
    }
    Next();
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    int links = 0;
    while (true) {
      RETURN_IF_ERROR(Link(&links));
      if (IsOp(".") || IsOp("[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    int links = 0;
    while (true) {
      RETURN_IF_ERROR(Link(&links));
      if (IsOp("|")) {
        ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
      } else if (IsName("is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const size_t offset = Cur().offset;
    if (IsOp(".")) {
      Next();
      if (Cur().type == TokenType::kName) {
        ExprPtr e = NewExpr(ExprType::kGetAttr, offset);
        e->a = std::move(node);
        e->name = Cur().value;
        Next();
        return e;
      }
      if (Cur().type != TokenType::kInteger) return Unexpected("a name or number after '.'");
      ExprPtr e = NewExpr(ExprType::kGetItem, offset);
      e->a = std::move(node);
      e->b = NewExpr(ExprType::kLiteral, Cur().offset);
      e->b->literal = Value::Int(Cur().int_value);
      Next();
      return e;
    }
    Next();  // [
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) RETURN_IF_ERROR(ExpectOp(","));
      ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
      args.push_back(std::move(arg));
    }
    Next();
    if (args.size() == 1 && args[0]->type == ExprType::kSlice) {
      args[0]->a = std::move(node);
      return std::move(args[0]);
    }
    ExprPtr e = NewExpr(ExprType::kGetItem, offset);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      for (const ExprPtr& arg : args) {
        if (arg->type == ExprType::kSlice) return Fail(arg->offset, "slices inside a tuple index are not supported");
      }
      e->b = NewExpr(ExprType::kTuple, offset);
      e->b->items = std::move(args);
    }
    return e;
  }

  // An index or a slice (kSlice without its object).
  absl::StatusOr<ExprPtr> ParseSubscribed() {
    const size_t offset = Cur().offset;
    ExprPtr start;
    if (!IsOp(":")) {
      ASSIGN_OR_RETURN(start, ParseExpression(true));
      if (!IsOp(":")) return start;
    }
    Next();  // the first ':'
    ExprPtr e = NewExpr(ExprType::kSlice, offset);
    e->b = std::move(start);
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      ASSIGN_OR_RETURN(e->c, ParseExpression(true));
    }
    if (IsOp(":")) {
      Next();
      if (!IsOp("]") && !IsOp(",")) {
        ASSIGN_OR_RETURN(e->d, ParseExpression(true));
      }
    }
    return e;
  }

  absl::Status ParseCallArgs(Expr* e) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool need_comma = false;
    while (!IsOp(")")) {
      if (need_comma) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return Fail(Cur().offset, "*args and **kwargs in calls are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOp && Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) return Fail(Cur().offset, "positional argument follows keyword argument");
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->items.push_back(std::move(value));
      }
      need_comma = true;
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr node) {
    ExprPtr e = NewExpr(ExprType::kCall, Cur().offset);
    e->a = std::move(node);
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  // `|f(...)|g...`; with start_inline the first filter has no '|' (a filter block).
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline) {
    int links = 0;
    while (IsOp("|") || start_inline) {
      RETURN_IF_ERROR(Link(&links));
      if (!start_inline) Next();
      start_inline = false;
      ExprPtr e = NewExpr(ExprType::kFilter, Cur().offset);
      ASSIGN_OR_RETURN(e->name, ExpectName());
      while (IsOp(".")) {
        Next();
        ASSIGN_OR_RETURN(std::string part, ExpectName());
        absl::StrAppend(&e->name, ".", part);
      }
      if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
      e->a = std::move(node);
      node = std::move(e);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    ExprPtr e = NewExpr(ExprType::kTest, Cur().offset);
    Next();  // is
    if (IsName("not")) {
      e->negated = true;
      Next();
    }
    ASSIGN_OR_RETURN(e->name, ExpectName());
    while (IsOp(".")) {
      Next();
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&e->name, ".", part);
    }
    const Token& t = Cur();
    if (IsOp("(")) {
      RETURN_IF_ERROR(ParseCallArgs(e.get()));
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                t.type == TokenType::kFloat || IsOp("[") || IsOp("{")) &&
               !(IsName("else") || IsName("or") || IsName("and"))) {
      if (IsName("is")) return Fail(t.offset, "you cannot chain multiple tests with is");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->items.push_back(std::move(arg));
    }
    e->a = std::move(node);
    return e;
  }

  std::string_view src_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(std::string_view normalized, std::vector<Token> tokens) {
  return Parser(normalized, std::move(tokens)).ParseAll();
}

}  // namespace tandem::chat_template_internal
