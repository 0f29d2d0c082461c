// Comparison of secrets (cluster tokens, API keys) whose time does not depend on where
// the two strings first differ, so that a client cannot find a secret byte by byte by
// timing refusals.
#pragma once

#include <string_view>

namespace tandem::security {

// True when `a` and `b` are equal. The time depends on the lengths only.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace tandem::security
