// General categories of the code points Unicode 15.0-16.0 assigned, for regexes whose
// PCRE2 knows an older Unicode than the Oniguruma of Hugging Face tokenizers.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tandem::tokenizer_internal {

struct CodePointRange {
  uint32_t lo;
  uint32_t hi;  // inclusive
};

// The code points Unicode 15.0-16.0 added to general category `category`: two letters
// ("Lo"), or one for the whole group ("L"). Empty for other names.
std::vector<CodePointRange> UnicodeAdditions(std::string_view category);

}  // namespace tandem::tokenizer_internal
