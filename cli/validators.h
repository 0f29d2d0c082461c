// CLI11 validators the stock ones lack. CLI::Range lets NaN through (every comparison
// with NaN is false), so numeric sampling flags use FiniteRange.
#pragma once

#include <cmath>
#include <string>

#include "CLI/CLI.hpp"

namespace tandem::cli {

inline CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(input, v) || !std::isfinite(v)) return "not a finite number: " + input;
        if (v < lo || v > hi) return "value " + input + " not in range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return {};
      },
      "FLOAT in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

}  // namespace tandem::cli
