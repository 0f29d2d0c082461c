#include "engine/chat_template/renderer.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "engine/chat_template/builtins.h"
#include "engine/chat_template/lexer.h"
#include "engine/chat_template/operators.h"
#include "engine/util/status_macros.h"

namespace tandem::chat_template_internal {
namespace {

// One scope: a for loop's iteration, a macro call, the template's top level. Names not
// found here are looked up in the enclosing scope.
// Names are views of strings the parsed template owns (or literals), which outlive
// every frame.
class Frame {
 public:
  explicit Frame(const Frame* parent) : parent_(parent) {}

  const Value* Find(std::string_view name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent_) {
      for (const auto& [k, v] : f->vars_) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }

  void Set(std::string_view name, Value v) {
    for (auto& [k, existing] : vars_) {
      if (k == name) {
        existing = std::move(v);
        return;
      }
    }
    vars_.emplace_back(name, std::move(v));
  }

 private:
  const Frame* parent_;
  absl::InlinedVector<std::pair<std::string_view, Value>, 4> vars_;
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer final : public Runtime {
 public:
  Renderer(std::string_view source, const RenderBudget& budget, const Dict& context)
      : source_(source), budget_(budget), context_(context) {}

  absl::StatusOr<std::string> Run(const Body& body) {
    Frame root(nullptr);
    root_ = &root;
    std::string out;
    ASSIGN_OR_RETURN(Flow flow, Exec(body, root, &out));
    (void)flow;
    return out;
  }

  // ---- Runtime ----
  absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) override {
    return chat_template_internal::GetAttr(obj, name);
  }
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) override {
    return chat_template_internal::GetItem(obj, key);
  }
  absl::StatusOr<Value> Call(const Value& callee, CallArgs args) override {
    if (callee.kind() != Kind::kCallable) {
      if (callee.is_undefined()) return UndefinedError(callee);
      return PyError("TypeError", absl::StrCat("'", TypeName(callee), "' object is not callable"));
    }
    const Callable& c = callee.callable();
    if (c.macro != nullptr) return CallMacro(*c.macro, args);
    static const Value kNoSelf;
    ASSIGN_OR_RETURN(Value out, c.builtin(*this, c.self ? *c.self : kNoSelf, args));
    // Markup's methods return Markup.
    if (c.self && c.self->is_string() && c.self->markup()) {
      if (out.is_string()) return Value::SharedString(out.shared_str(), true);
      if (out.is_list() && !out.list().empty() && out.list()[0].is_string()) {
        std::vector<Value> items;
        for (const Value& v : out.list())
          items.push_back(v.is_string() ? Value::SharedString(v.shared_str(), true) : v);
        return Value::List(std::move(items), out.is_tuple());
      }
    }
    return out;
  }
  absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, CallArgs args) override {
    RETURN_IF_ERROR(Step());
    FilterFn fn = FindFilter(name);
    if (fn == nullptr) {
      return PyError("TemplateRuntimeError",
                     absl::StrCat(IsKnownFilter(name) ? "the filter '" : "no filter named '", std::string(name),
                                  IsKnownFilter(name) ? "' is not supported by this interpreter" : "'"));
    }
    return fn(*this, input, args);
  }
  absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, CallArgs args) override {
    RETURN_IF_ERROR(Step());
    TestFn fn = FindTest(name);
    if (fn == nullptr) {
      return PyError("TemplateRuntimeError",
                     absl::StrCat(IsKnownTest(name) ? "the test '" : "no test named '", std::string(name),
                                  IsKnownTest(name) ? "' is not supported by this interpreter" : "'"));
    }
    return fn(*this, input, args);
  }
  absl::Status Charge(size_t bytes) override {
    allocated_ += static_cast<int64_t>(bytes);
    if (allocated_ > budget_.max_allocated_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chat template allocated more than ", budget_.max_allocated_bytes, " bytes"));
    }
    return absl::OkStatus();
  }
  absl::Status Step() override {
    if (++steps_ > budget_.max_steps) {
      return absl::ResourceExhaustedError(absl::StrCat("chat template ran more than ", budget_.max_steps, " steps"));
    }
    return absl::OkStatus();
  }
  int64_t NowMicros() override {
    if (budget_.now_micros) return budget_.now_micros();
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

 private:
  // Prefixes the position of `offset` unless the message has one already.
  absl::Status At(size_t offset, const absl::Status& s) const {
    if (s.ok() || s.code() == absl::StatusCode::kResourceExhausted) return s;
    if (s.message().substr(0, 5) == "line ") return s;
    return absl::Status(s.code(), absl::StrCat(Position(source_, offset), ": ", std::string(s.message())));
  }
  template <typename T>
  absl::StatusOr<T> At(size_t offset, absl::StatusOr<T> v) const {
    if (v.ok()) return v;
    return At(offset, v.status());
  }

  absl::Status Append(std::string* out, std::string_view text) {
    output_ += static_cast<int64_t>(text.size());
    if (output_ > budget_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chat template output exceeds ", budget_.max_output_bytes, " bytes"));
    }
    out->append(text);
    return absl::OkStatus();
  }

  // ---- statements ----

  absl::StatusOr<Flow> Exec(const Body& body, Frame& frame, std::string* out) {
    for (const StmtPtr& s : body) {
      ASSIGN_OR_RETURN(Flow flow, ExecStmt(*s, frame, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecStmt(const Stmt& s, Frame& frame, std::string* out) {
    RETURN_IF_ERROR(Step());
    switch (s.type) {
      case StmtType::kText:
        RETURN_IF_ERROR(Append(out, s.text));
        return Flow::kNormal;
      case StmtType::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        RETURN_IF_ERROR(Append(out, v.is_string() ? std::string_view(v.str()) : std::string_view(PyStr(v))));
        return Flow::kNormal;
      }
      case StmtType::kIf:
        for (const auto& [cond, body] : s.branches) {
          ASSIGN_OR_RETURN(Value c, Eval(*cond, frame));
          if (Truthy(c)) return Exec(body, frame, out);
        }
        return Exec(s.else_body, frame, out);
      case StmtType::kFor:
        return ExecFor(s, frame, out);
      case StmtType::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        RETURN_IF_ERROR(At(s.offset, Assign(s, frame, std::move(v))));
        return Flow::kNormal;
      }
      case StmtType::kSetBlock: {
        std::string captured;
        ASSIGN_OR_RETURN(Flow flow, Exec(s.body, frame, &captured));
        RETURN_IF_ERROR(Charge(captured.size()));
        Value v = Value::String(std::move(captured));
        if (s.filter) {
          ASSIGN_OR_RETURN(v, EvalFilter(*s.filter, frame, &v));
        }
        frame.Set(s.targets[0], std::move(v));
        return flow;
      }
      case StmtType::kMacro: {
        Callable c;
        c.name = s.macro->name;
        c.macro = s.macro.get();
        frame.Set(s.macro->name, Value::MakeCallable(std::move(c)));
        return Flow::kNormal;
      }
      case StmtType::kFilterBlock: {
        std::string captured;
        ASSIGN_OR_RETURN(Flow flow, Exec(s.body, frame, &captured));
        RETURN_IF_ERROR(Charge(captured.size()));
        Value input = Value::String(std::move(captured));
        ASSIGN_OR_RETURN(Value v, EvalFilter(*s.filter, frame, &input));
        RETURN_IF_ERROR(Append(out, PyStr(v)));
        return flow;
      }
      case StmtType::kBreak:
        return Flow::kBreak;
      case StmtType::kContinue:
        return Flow::kContinue;
      case StmtType::kScope:
        return Exec(s.body, frame, out);
    }
    return Flow::kNormal;
  }

  // Binds the targets of a for loop or set: one name, or unpacking an iterable.
  absl::Status Bind(const std::vector<std::string>& targets, Frame& frame, Value v) {
    if (targets.size() == 1) {
      frame.Set(targets[0], std::move(v));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    if (items.size() != targets.size()) {
      if (items.size() > targets.size()) {
        return PyError("ValueError", absl::StrCat("too many values to unpack (expected ", targets.size(), ")"));
      }
      return PyError("ValueError", absl::StrCat("not enough values to unpack (expected ", targets.size(), ", got ",
                                                items.size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) frame.Set(targets[i], std::move(items[i]));
    return absl::OkStatus();
  }

  absl::Status Assign(const Stmt& s, Frame& frame, Value v) {
    if (s.attr.empty()) return Bind(s.targets, frame, std::move(v));
    const Value* ns = Lookup(s.targets[0], frame);
    if (ns == nullptr || ns->kind() != Kind::kNamespace) {
      return PyError("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    }
    if (ContainsKind(v, Kind::kNamespace) || ContainsKind(v, Kind::kLoop)) {
      return PyError("TemplateRuntimeError",
                     "storing a namespace or loop object in a namespace is not supported by this interpreter");
    }
    ns->ns().attrs.Set(s.attr, std::move(v));
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s, Frame& frame, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, frame));
    ASSIGN_OR_RETURN(std::vector<Value> items, At(s.expr->offset, Iterate(*this, iterable)));
    if (s.cond) {
      std::vector<Value> kept;
      for (Value& item : items) {
        Frame f(&frame);
        RETURN_IF_ERROR(At(s.offset, Bind(s.targets, f, item)));
        ASSIGN_OR_RETURN(Value c, Eval(*s.cond, f));
        if (Truthy(c)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame f(&frame);
      return Exec(s.else_body, f, out);
    }
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<const std::vector<Value>>(std::move(items));
    const Value loop = Value::MakeLoop(state);
    for (size_t i = 0; i < state->items->size(); ++i) {
      RETURN_IF_ERROR(Step());
      state->index0 = static_cast<int64_t>(i);
      Frame f(&frame);
      f.Set("loop", loop);
      RETURN_IF_ERROR(At(s.offset, Bind(s.targets, f, (*state->items)[i])));
      ASSIGN_OR_RETURN(Flow flow, Exec(s.body, f, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> CallMacro(const MacroStmt& m, CallArgs& args) {
    if (call_depth_ >= budget_.max_call_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chat template macro calls nested more than ", budget_.max_call_depth, " deep"));
    }
    if (args.positional.size() > m.params.size()) {
      return PyError("TypeError",
                     absl::StrCat("macro '", m.name, "' takes not more than ", m.params.size(), " argument(s)"));
    }
    std::vector<std::optional<Value>> given(m.params.size());
    for (size_t i = 0; i < args.positional.size(); ++i) given[i] = std::move(args.positional[i]);
    for (auto& [key, v] : args.keyword) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i] != key) ++i;
      if (i == m.params.size()) {
        return PyError("TypeError", absl::StrCat("macro '", m.name, "' takes no keyword argument '", key, "'"));
      }
      if (given[i])
        return PyError("TypeError", absl::StrCat("macro '", m.name, "' got multiple values for '", key, "'"));
      given[i] = std::move(v);
    }
    Frame f(root_);
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (given[i]) {
        f.Set(m.params[i], std::move(*given[i]));
      } else if (m.defaults[i]) {
        ASSIGN_OR_RETURN(Value d, Eval(*m.defaults[i], f));
        f.Set(m.params[i], std::move(d));
      } else {
        f.Set(m.params[i], Value::Undefined(absl::StrCat("parameter '", m.params[i], "' was not provided")));
      }
    }
    std::string out;
    ++call_depth_;
    absl::StatusOr<Flow> flow = Exec(m.body, f, &out);
    --call_depth_;
    RETURN_IF_ERROR(flow.status());
    RETURN_IF_ERROR(Charge(out.size()));
    return Value::String(std::move(out));
  }

  // ---- expressions ----

  const Value* Lookup(std::string_view name, const Frame& frame) const {
    if (const Value* v = frame.Find(name)) return v;
    return context_.Find(name);
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, const Frame& frame) {
    CallArgs args;
    for (const ExprPtr& item : e.items) {
      ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*expr, frame));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  // A kFilter node; a chain's innermost null input is *block_input.
  absl::StatusOr<Value> EvalFilter(const Expr& e, const Frame& frame, const Value* block_input) {
    Value input;
    if (e.a == nullptr) {
      input = *block_input;
    } else if (e.a->type == ExprType::kFilter) {
      ASSIGN_OR_RETURN(input, EvalFilter(*e.a, frame, block_input));
    } else {
      ASSIGN_OR_RETURN(input, Eval(*e.a, frame));
    }
    ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
    return At(e.offset, ApplyFilter(e.name, input, std::move(args)));
  }

  absl::StatusOr<Value> Eval(const Expr& e, const Frame& frame) {
    ASSIGN_OR_RETURN(Value v, EvalNode(e, frame));
    if (v.depth() > kMaxValueDepth) {
      return At(e.offset, PyError("RecursionError", "lists or dicts nested too deeply"));
    }
    return v;
  }

  absl::StatusOr<Value> EvalNode(const Expr& e, const Frame& frame) {
    RETURN_IF_ERROR(Step());
    switch (e.type) {
      case ExprType::kLiteral:
        return e.literal;
      case ExprType::kName: {
        if (const Value* v = Lookup(e.name, frame)) return *v;
        if (std::optional<Value> g = FindGlobal(e.name)) return *g;
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case ExprType::kList:
      case ExprType::kTuple: {
        std::vector<Value> items;
        items.reserve(e.items.size());
        for (const ExprPtr& item : e.items) {
          ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
          items.push_back(std::move(v));
        }
        RETURN_IF_ERROR(Charge(items.size() * sizeof(Value)));
        return Value::List(std::move(items), e.type == ExprType::kTuple);
      }
      case ExprType::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.items[i], frame));
          ASSIGN_OR_RETURN(Value v, Eval(*e.items[i + 1], frame));
          if (!k.is_string()) {
            return At(e.items[i]->offset,
                      PyError("TypeError", "dict literals with keys other than strings are not supported"));
          }
          d.Set(k.str(), std::move(v));
        }
        RETURN_IF_ERROR(Charge(d.size() * (sizeof(Value) + 32)));
        return Value::MakeDict(std::move(d));
      }
      case ExprType::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.a, frame));
        return At(e.offset, GetAttr(obj, e.name));
      }
      case ExprType::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.a, frame));
        ASSIGN_OR_RETURN(Value key, Eval(*e.b, frame));
        return At(e.offset, GetItem(obj, key));
      }
      case ExprType::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.a, frame));
        std::optional<Value> bounds[3];
        const Expr* exprs[3] = {e.b.get(), e.c.get(), e.d.get()};
        for (int i = 0; i < 3; ++i) {
          if (exprs[i] != nullptr) {
            ASSIGN_OR_RETURN(bounds[i], Eval(*exprs[i], frame));
          }
        }
        return At(e.offset, Slice(*this, obj, bounds[0], bounds[1], bounds[2]));
      }
      case ExprType::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.a, frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        return At(e.offset, Call(callee, std::move(args)));
      }
      case ExprType::kFilter:
        return EvalFilter(e, frame, nullptr);
      case ExprType::kTest: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.a, frame));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        ASSIGN_OR_RETURN(bool r, At(e.offset, ApplyTest(e.name, input, std::move(args))));
        return Value::Bool(e.negated ? !r : r);
      }
      case ExprType::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.a, frame));
        return Value::Bool(!Truthy(v));
      }
      case ExprType::kNeg:
      case ExprType::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.a, frame));
        return At(e.offset, e.type == ExprType::kNeg ? Negate(v) : UnaryPlus(v));
      }
      case ExprType::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.a, frame));
        ASSIGN_OR_RETURN(Value b, Eval(*e.b, frame));
        return At(e.offset, BinaryOp(*this, e.name, a, b));
      }
      case ExprType::kConcat: {
        std::vector<Value> parts;
        size_t size = 0;
        for (const ExprPtr& item : e.items) {
          ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
          if (!v.is_string()) v = Value::String(PyStr(v));
          size += v.str().size();
          parts.push_back(std::move(v));
        }
        RETURN_IF_ERROR(Charge(size));
        std::string s;
        s.reserve(size);
        for (const Value& v : parts) s += v.str();
        return Value::String(std::move(s));
      }
      case ExprType::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.a, frame));
        for (const auto& [op, rhs] : e.ops) {
          ASSIGN_OR_RETURN(Value right, Eval(*rhs, frame));
          ASSIGN_OR_RETURN(bool r, At(rhs->offset, CompareOp(op, left, right)));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprType::kAnd:
      case ExprType::kOr: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.a, frame));
        if (Truthy(left) == (e.type == ExprType::kOr)) return left;
        return Eval(*e.b, frame);
      }
      case ExprType::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.a, frame));
        if (Truthy(c)) return Eval(*e.b, frame);
        if (e.c) return Eval(*e.c, frame);
        return Value::Undefined("the inline if-expression evaluated to false and no else section was defined.");
      }
    }
    return Value::Undefined("unknown expression");
  }

  std::string_view source_;
  const RenderBudget& budget_;
  const Dict& context_;
  Frame* root_ = nullptr;
  int64_t steps_ = 0;
  int64_t allocated_ = 0;
  int64_t output_ = 0;
  int call_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RenderTemplate(std::string_view source, const Body& body, const Value& context,
                                           const RenderBudget& budget) {
  if (!context.is_dict()) return absl::InvalidArgumentError("chat template context must be a JSON object");
  Renderer r(source, budget, context.dict());
  return r.Run(body);
}

}  // namespace tandem::chat_template_internal
