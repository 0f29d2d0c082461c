// Ids for tool calls, as OpenAI writes them: "call_" and 24 letters and digits.
#pragma once

#include <functional>
#include <string>

namespace tandem::output_parsing {

// Returns a new id each call. ChatOutputParser takes one so that tests can supply
// predictable ids.
using ToolCallIdSource = std::function<std::string()>;

// "call_" and 24 random [A-Za-z0-9] (about 143 bits: unique without coordination).
std::string RandomToolCallId();

}  // namespace tandem::output_parsing
