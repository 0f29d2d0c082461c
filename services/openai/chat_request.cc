#include "services/openai/chat_request.h"

#include <string>
#include <variant>

#include "absl/strings/str_cat.h"

namespace tandem::openai {
namespace {

// A message's content: a string or a list of text parts; nullopt when absent or null.
std::variant<std::optional<std::string>, ApiError> Content(const Json& message, const std::string& where) {
  const Json* content = Field(message, "content");
  if (content == nullptr) return std::optional<std::string>();
  if (content->is_string()) return std::optional<std::string>(content->get<std::string>());
  if (!content->is_array()) return TypeError(where + ".content", "a string or a list of text parts");
  std::string text;
  for (const Json& part : *content) {
    const Json* type = part.is_object() ? Field(part, "type") : nullptr;
    const Json* part_text = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" || part_text == nullptr ||
        !part_text->is_string()) {
      return InvalidRequest(where + ".content",
                            where + ".content: parts other than {\"type\": \"text\", \"text\": ...} are not supported");
    }
    text += part_text->get<std::string>();
  }
  return std::optional<std::string>(std::move(text));
}

// An assistant's earlier calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::optional<ApiError> ToolCalls(const Json& calls, const std::string& where, v1::ChatMessage* out) {
  if (!calls.is_array()) return TypeError(where, "a list of tool calls");
  for (size_t j = 0; j < calls.size(); ++j) {
    const std::string at = absl::StrCat(where, "[", j, "]");
    const Json& call = calls[j];
    if (!call.is_object()) return TypeError(at, "an object with id, type and function");
    v1::ToolCall* c = out->add_tool_calls();
    if (const Json* id = Field(call, "id")) {
      if (!id->is_string()) return TypeError(at + ".id", "a string");
      c->set_id(id->get<std::string>());
    }
    if (const Json* type = Field(call, "type"); type != nullptr && !(type->is_string() && *type == "function")) {
      return InvalidRequest(at + ".type", at + ".type: must be \"function\"");
    }
    const Json* function = Field(call, "function");
    if (function == nullptr || !function->is_object()) return TypeError(at + ".function", "an object with name and arguments");
    const Json* name = Field(*function, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
      return TypeError(at + ".function.name", "a non-empty string");
    }
    c->set_name(name->get<std::string>());
    if (const Json* arguments = Field(*function, "arguments")) {
      // OpenAI sends the arguments as JSON text; an object is taken as what it encodes.
      if (arguments->is_string()) {
        c->set_arguments(arguments->get<std::string>());
      } else if (arguments->is_object()) {
        c->set_arguments(arguments->dump());
      } else {
        return TypeError(at + ".function.arguments", "a string of JSON");
      }
    }
  }
  return std::nullopt;
}

std::optional<ApiError> Messages(const Json& body, v1::ChatMessages* chat) {
  const Json* m = Field(body, "messages");
  if (m == nullptr) return InvalidRequest("messages", "messages: required");
  if (!m->is_array() || m->empty()) return TypeError("messages", "a non-empty list of messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& message = (*m)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return TypeError(where, "an object with role and content");
    const Json* role = Field(message, "role");
    if (role == nullptr || !role->is_string()) return TypeError(where + ".role", "a string");
    std::string role_name = role->get<std::string>();
    if (role_name != "system" && role_name != "user" && role_name != "assistant" && role_name != "developer" &&
        role_name != "tool") {
      return InvalidRequest(where + ".role", absl::StrCat(where, ".role: '", role_name,
                                                          "' is not one of system, developer, user, assistant, tool"));
    }
    if (role_name == "developer") role_name = "system";
    v1::ChatMessage* out = chat->add_messages();
    out->set_role(role_name);
    auto content = Content(message, where);
    if (auto* e = std::get_if<ApiError>(&content)) return *e;
    std::optional<std::string>& text = std::get<std::optional<std::string>>(content);
    if (const Json* name = Field(message, "name")) {
      if (!name->is_string()) return TypeError(where + ".name", "a string");
      out->set_name(name->get<std::string>());
    }
    if (const Json* calls = Field(message, "tool_calls")) {
      if (role_name != "assistant") {
        return InvalidRequest(where + ".tool_calls", where + ".tool_calls: only an assistant message has tool calls");
      }
      if (auto e = ToolCalls(*calls, where + ".tool_calls", out)) return e;
    }
    if (role_name == "tool") {
      const Json* id = Field(message, "tool_call_id");
      if (id == nullptr || !id->is_string() || id->get<std::string>().empty()) {
        return TypeError(where + ".tool_call_id", "the id of the call this message answers (a string)");
      }
      out->set_tool_call_id(id->get<std::string>());
    }
    if (text) {
      out->set_content(std::move(*text));
    } else if (role_name != "assistant") {
      return InvalidRequest(where + ".content", where + ".content: required");
    } else if (out->tool_calls().empty()) {
      out->set_content("");  // an empty assistant turn; only a turn of calls shows None
    }
  }
  return std::nullopt;
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}].
std::optional<ApiError> Tools(const Json& tools) {
  if (!tools.is_array()) return TypeError("tools", "a list of tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object()) return TypeError(at, "an object with type and function");
    const Json* type = Field(tool, "type");
    if (type == nullptr || !(type->is_string() && *type == "function")) {
      return InvalidRequest(at + ".type", at + ".type: must be \"function\"");
    }
    const Json* function = Field(tool, "function");
    if (function == nullptr || !function->is_object()) return TypeError(at + ".function", "an object with a name");
    const Json* name = Field(*function, "name");
    if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
      return TypeError(at + ".function.name", "a non-empty string");
    }
    if (const Json* d = Field(*function, "description"); d != nullptr && !d->is_string()) {
      return TypeError(at + ".function.description", "a string");
    }
    if (const Json* p = Field(*function, "parameters"); p != nullptr && !p->is_object()) {
      return TypeError(at + ".function.parameters", "a JSON schema object");
    }
  }
  return std::nullopt;
}

// {"type": "function", "function": {"name": NAME}}.
std::optional<ApiError> NamedFunction(const Json& c, std::string* name) {
  const Json* type = Field(c, "type");
  if (type == nullptr || !(type->is_string() && *type == "function")) {
    return InvalidRequest("tool_choice.type", "tool_choice.type: must be \"function\"");
  }
  const Json* function = Field(c, "function");
  if (function == nullptr || !function->is_object()) return TypeError("tool_choice.function", "an object with a name");
  const Json* n = Field(*function, "name");
  if (n == nullptr || !n->is_string() || n->get<std::string>().empty()) {
    return TypeError("tool_choice.function.name", "a non-empty string");
  }
  *name = n->get<std::string>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseChat(const Json& body, v1::GenerateRequest* r, ChatOptions* out) {
  v1::ChatMessages* chat = r->mutable_chat();
  if (auto e = Messages(body, chat)) return e;
  const Json* tools = Field(body, "tools");
  if (tools != nullptr) {
    if (auto e = Tools(*tools)) return e;
    if (tools->empty()) tools = nullptr;
  }
  std::string choice = tools != nullptr ? "auto" : "none";
  std::string named;
  if (const Json* c = Field(body, "tool_choice")) {
    if (c->is_string() && (*c == "none" || *c == "auto" || *c == "required")) {
      choice = c->get<std::string>();
    } else if (c->is_object()) {
      choice = "named";
      if (auto e = NamedFunction(*c, &named)) return e;
    } else {
      return InvalidRequest("tool_choice", "tool_choice: must be \"none\", \"auto\", \"required\" or "
                                           "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (choice != "none" && tools == nullptr) {
      return InvalidRequest("tool_choice", "tool_choice: needs tools");
    }
  }
  if (choice == "required" || choice == "named") {
    RequiredToolCalls calls;
    if (auto e = ReadCallableTools(*tools, named, &calls)) return e;
    if (calls.tools.empty()) {
      return InvalidRequest("tool_choice.function.name",
                            absl::StrCat("tool_choice.function.name: no tool is named '", named, "'"));
    }
    std::optional<ApiError> error;
    const std::optional<bool> parallel = Bool(body, "parallel_tool_calls", &error);
    if (error) return TypeError("parallel_tool_calls", "a boolean");
    // OpenAI's named choice is one call to that function.
    calls.single = choice == "named" || parallel == false;
    out->required_calls = std::move(calls);
  }
  if (tools != nullptr) chat->set_tools_json(tools->dump());
  out->parse_tool_calls = tools != nullptr && choice != "none";
  if (const Json* kwargs = Field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return TypeError("chat_template_kwargs", "an object");
    std::optional<ApiError> error;
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (auto v = Bool(*kwargs, key, &error)) out->thinking = *v;
      if (error) return TypeError(absl::StrCat("chat_template_kwargs.", key), "a boolean");
    }
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (kwargs->contains(reserved)) {
        return InvalidRequest("chat_template_kwargs",
                              absl::StrCat("chat_template_kwargs.", reserved, ": set by the request itself"));
      }
    }
    if (!kwargs->empty()) chat->set_template_kwargs_json(kwargs->dump());
  }
  return std::nullopt;
}

}  // namespace tandem::openai
