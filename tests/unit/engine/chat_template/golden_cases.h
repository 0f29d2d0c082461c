// The golden chat templates and conversations (tests/goldens/chat_templates) as the
// reference tests read them, and how a conversation becomes an apply_chat_template call.
#pragma once

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

using OrderedJson = nlohmann::ordered_json;

inline std::string SourceDir() {
  const char* d = std::getenv("TANDEM_SOURCE_DIR");
  return d == nullptr ? "" : d;
}
inline std::string BinaryDir() {
  const char* d = std::getenv("TANDEM_BINARY_DIR");
  return d == nullptr ? "" : d;
}
inline std::string GoldensDir() { return SourceDir() + "/tests/goldens/chat_templates"; }

inline std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline OrderedJson ReadJson(const std::string& path) {
  std::optional<std::string> text = ReadFile(path);
  if (!text) return OrderedJson();
  return OrderedJson::parse(*text, nullptr, /*allow_exceptions=*/false);
}

struct GoldenTemplate {
  std::string name;
  std::string source;
  SpecialTokens tokens;
};

inline std::vector<GoldenTemplate> LoadGoldenTemplates() {
  std::vector<GoldenTemplate> out;
  const OrderedJson manifest = ReadJson(GoldensDir() + "/templates.json");
  if (!manifest.is_object()) return out;
  for (const OrderedJson& t : manifest["templates"]) {
    GoldenTemplate g;
    g.name = t["name"].get<std::string>();
    g.source = ReadFile(GoldensDir() + "/" + t["file"].get<std::string>()).value_or("");
    if (t["bos_token"].is_string()) g.tokens.bos_token = t["bos_token"].get<std::string>();
    if (t["eos_token"].is_string()) g.tokens.eos_token = t["eos_token"].get<std::string>();
    out.push_back(std::move(g));
  }
  return out;
}

// A conversation of conversations.json as the request transformers would get.
inline ChatRequest RequestOf(const OrderedJson& conversation) {
  ChatRequest r;
  r.messages = conversation["messages"];
  if (conversation.contains("tools")) r.tools = conversation["tools"];
  r.add_generation_prompt = conversation.value("add_generation_prompt", true);
  if (conversation.contains("kwargs")) r.kwargs = conversation["kwargs"];
  return r;
}

// Printable form of a string for failure messages (bytes cut mid-character print as U+FFFD).
inline std::string Quoted(const std::string& s) {
  return OrderedJson(s).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace tandem::testing
