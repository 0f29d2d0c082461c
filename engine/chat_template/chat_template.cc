#include "engine/chat_template/chat_template.h"

#include "absl/strings/str_cat.h"
#include "engine/chat_template/ast.h"
#include "engine/chat_template/builtins.h"
#include "engine/chat_template/lexer.h"
#include "engine/chat_template/parser.h"
#include "engine/chat_template/renderer.h"
#include "engine/chat_template/value.h"
#include "engine/util/status_macros.h"

namespace tandem {

using chat_template_internal::Body;
using chat_template_internal::Expr;
using chat_template_internal::ExprType;
using chat_template_internal::Stmt;

struct ChatTemplate::Program {
  std::string source;      // as given
  std::string normalized;  // what token offsets refer to
  Body body;
};

namespace {

absl::Status Prefixed(const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kResourceExhausted) return s;
  return absl::Status(s.code(), absl::StrCat("chat template ", std::string(s.message())));
}

// Jinja2 refuses, when it compiles a template, a filter or test name it does not know,
// except inside an `if` (its test and its branches) or a conditional expression, where
// it raises only if the name is used; loops, block sets, macros and filter blocks open
// a scope where the check applies again.
class NameChecker {
 public:
  explicit NameChecker(std::string_view src) : src_(src) {}

  absl::Status Body(const chat_template_internal::Body& body, bool soft) {
    for (const auto& s : body) RETURN_IF_ERROR(Statement(*s, soft));
    return absl::OkStatus();
  }

 private:
  absl::Status Statement(const Stmt& s, bool soft) {
    using chat_template_internal::StmtType;
    switch (s.type) {
      case StmtType::kIf:
        for (const auto& [cond, body] : s.branches) {
          RETURN_IF_ERROR(Expression(cond.get(), true));
          RETURN_IF_ERROR(Body(body, true));
        }
        return Body(s.else_body, true);
      case StmtType::kFor:
        RETURN_IF_ERROR(Expression(s.expr.get(), soft));
        RETURN_IF_ERROR(Expression(s.cond.get(), false));
        RETURN_IF_ERROR(Body(s.body, false));
        return Body(s.else_body, false);
      case StmtType::kMacro:
        for (const auto& d : s.macro->defaults) RETURN_IF_ERROR(Expression(d.get(), false));
        return Body(s.macro->body, false);
      case StmtType::kSetBlock:
      case StmtType::kFilterBlock:
      case StmtType::kScope:
        RETURN_IF_ERROR(Expression(s.filter.get(), false));
        return Body(s.body, false);
      default:
        return Expression(s.expr.get(), soft);
    }
  }

  absl::Status Expression(const Expr* e, bool soft) {
    if (e == nullptr) return absl::OkStatus();
    if (!soft && e->type == ExprType::kFilter && !chat_template_internal::IsKnownFilter(e->name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(chat_template_internal::Position(src_, e->offset), ": no filter named '", e->name, "'"));
    }
    if (!soft && e->type == ExprType::kTest && !chat_template_internal::IsKnownTest(e->name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(chat_template_internal::Position(src_, e->offset), ": no test named '", e->name, "'"));
    }
    if (e->type == ExprType::kCond) soft = true;
    for (const Expr* child : {e->a.get(), e->b.get(), e->c.get(), e->d.get()}) {
      RETURN_IF_ERROR(Expression(child, soft));
    }
    for (const auto& item : e->items) RETURN_IF_ERROR(Expression(item.get(), soft));
    for (const auto& [k, v] : e->kwargs) RETURN_IF_ERROR(Expression(v.get(), soft));
    for (const auto& [op, v] : e->ops) RETURN_IF_ERROR(Expression(v.get(), soft));
    return absl::OkStatus();
  }

  std::string_view src_;
};

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->normalized = chat_template_internal::NormalizeNewlines(source);
  absl::StatusOr<std::vector<chat_template_internal::Token>> tokens =
      chat_template_internal::Tokenize(program->normalized);
  if (!tokens.ok()) return Prefixed(tokens.status());
  absl::StatusOr<Body> body = chat_template_internal::Parse(program->normalized, *std::move(tokens));
  if (!body.ok()) return Prefixed(body.status());
  program->body = *std::move(body);
  RETURN_IF_ERROR(Prefixed(NameChecker(program->normalized).Body(program->body, false)));
  return ChatTemplate(std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits) const {
  if (!context.is_object()) return absl::InvalidArgumentError("chat template context: expected a JSON object");
  absl::StatusOr<chat_template_internal::Value> ctx = chat_template_internal::FromJson(context);
  if (!ctx.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template context: ", ctx.status().message()));
  const chat_template_internal::RenderBudget budget{limits.max_output_bytes, limits.max_allocated_bytes,
                                                    limits.max_steps, limits.max_call_depth, limits.now_micros};
  absl::StatusOr<std::string> out =
      chat_template_internal::RenderTemplate(program_->normalized, program_->body, *ctx, budget);
  if (!out.ok()) return Prefixed(out.status());
  return out;
}

const std::string& ChatTemplate::source() const { return program_->source; }

absl::StatusOr<nlohmann::ordered_json> MakeChatContext(const ChatRequest& request, const SpecialTokens& tokens) {
  if (!request.messages.is_array()) return absl::InvalidArgumentError("messages: expected an array");
  if (!request.tools.is_null() && !request.tools.is_array()) {
    return absl::InvalidArgumentError("tools: expected an array or null");
  }
  if (!request.kwargs.is_object()) return absl::InvalidArgumentError("chat_template_kwargs: expected an object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = request.messages;
  context["tools"] = request.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = request.add_generation_prompt;
  const std::pair<const char*, const std::optional<std::string>*> special[] = {
      {"bos_token", &tokens.bos_token},  {"eos_token", &tokens.eos_token}, {"unk_token", &tokens.unk_token},
      {"sep_token", &tokens.sep_token},  {"pad_token", &tokens.pad_token}, {"cls_token", &tokens.cls_token},
      {"mask_token", &tokens.mask_token}};
  for (const auto& [name, value] : special) {
    if (*value) context[name] = **value;
  }
  for (const auto& [key, value] : request.kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
      return absl::InvalidArgumentError(absl::StrCat("chat_template_kwargs: '", key, "' is set by the request itself"));
    }
    context[key] = value;
  }
  return context;
}

}  // namespace tandem
