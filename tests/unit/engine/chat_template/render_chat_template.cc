// render_chat_template TEMPLATE_FILE CONTEXT_JSON_FILE: prints the rendering (or the
// error, exit 1). A debugging aid for comparing with Jinja2 by hand.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "engine/chat_template/chat_template.h"

namespace {
bool Read(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  std::string source, context;
  if (argc != 3 || !Read(argv[1], &source) || !Read(argv[2], &context)) {
    std::fprintf(stderr, "usage: render_chat_template TEMPLATE_FILE CONTEXT_JSON_FILE\n");
    return 2;
  }
  const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(context, nullptr, false);
  absl::StatusOr<tandem::ChatTemplate> t = tandem::ChatTemplate::Parse(source);
  if (!t.ok()) {
    std::cerr << t.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::string> out = t->Render(ctx);
  if (!out.ok()) {
    std::cerr << out.status() << "\n";
    return 1;
  }
  std::cout << *out;
  return 0;
}
