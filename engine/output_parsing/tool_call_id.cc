#include "engine/output_parsing/tool_call_id.h"

#include <string_view>

#include "absl/random/random.h"

namespace tandem::output_parsing {

std::string RandomToolCallId() {
  constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[absl::Uniform<size_t>(gen, 0, kAlphabet.size())];
  return id;
}

}  // namespace tandem::output_parsing
