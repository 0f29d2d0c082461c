#include "engine/runtime/sampling_params.h"

#include <cmath>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

absl::Status OutOfRange(const std::string& field, const std::string& range,
                        const std::string& got) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be in ", range, ", got ", got));
}

// `value` in [lo, hi] (or (lo, hi] when lo_open), and finite.
absl::Status CheckRange(const char* field, float value, float lo, float hi, bool lo_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return OutOfRange(field, absl::StrCat(lo_open ? "(" : "[", lo, ", ", hi, "]"),
                    absl::StrCat(value));
}

// Well-formed UTF-8 as the Unicode standard defines it (no overlongs, surrogates or code
// points above U+10FFFF).
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

absl::Status Validate(const SamplingParams& p, int64_t vocab_size) {
  TANDEM_CHECK(vocab_size > 0) << vocab_size;
  RETURN_IF_ERROR(CheckRange("temperature", p.temperature, 0.0f, kMaxTemperature, false));
  RETURN_IF_ERROR(CheckRange("top_p", p.top_p, 0.0f, 1.0f, true));
  if (p.top_k < -1) {
    return OutOfRange("top_k", "[-1, inf) (0 and -1 disable it)", absl::StrCat(p.top_k));
  }
  RETURN_IF_ERROR(CheckRange("min_p", p.min_p, 0.0f, 1.0f, false));
  RETURN_IF_ERROR(CheckRange("repetition_penalty", p.repetition_penalty, 0.0f,
                             kMaxRepetitionPenalty, true));
  RETURN_IF_ERROR(CheckRange("presence_penalty", p.presence_penalty,
                             -kMaxAbsPresenceFrequencyPenalty, kMaxAbsPresenceFrequencyPenalty,
                             false));
  RETURN_IF_ERROR(CheckRange("frequency_penalty", p.frequency_penalty,
                             -kMaxAbsPresenceFrequencyPenalty, kMaxAbsPresenceFrequencyPenalty,
                             false));
  if (p.logprobs < 0 || p.logprobs > kMaxLogprobs) {
    return OutOfRange("logprobs", absl::StrCat("[0, ", kMaxLogprobs, "]"),
                      absl::StrCat(p.logprobs));
  }
  if (p.logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias: at most ", kMaxLogitBias, " tokens, got ", p.logit_bias.size()));
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto& [id, bias] = p.logit_bias[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (!(bias >= -kMaxAbsLogitBias && bias <= kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: the bias of token ", id,
                                                     " must be in [-100, 100], got ", bias));
    }
    for (size_t j = 0; j < i; ++j) {
      if (p.logit_bias[j].first == id) {
        return absl::InvalidArgumentError(absl::StrCat("logit_bias: token id ", id, " appears twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const StopParams& p, int64_t vocab_size) {
  TANDEM_CHECK(vocab_size > 0) << vocab_size;
  if (p.max_tokens < 1) {
    return OutOfRange("max_tokens", "[1, inf)", absl::StrCat(p.max_tokens));
  }
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return OutOfRange("min_tokens", absl::StrCat("[0, max_tokens = ", p.max_tokens, "]"),
                      absl::StrCat(p.min_tokens));
  }
  if (p.stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("stop: at most ", kMaxStopStrings,
                                                   " stop strings, got ", p.stop.size()));
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    const std::string& s = p.stop[i];
    if (s.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is empty"));
    }
    if (s.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is ", s.size(),
                                                     " bytes long; at most ",
                                                     kMaxStopStringBytes, " allowed"));
    }
    if (!IsValidUtf8(s)) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is not valid UTF-8"));
    }
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    const int32_t id = p.stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return OutOfRange(absl::StrCat("stop_token_ids[", i, "]"),
                        absl::StrCat("[0, vocab_size = ", vocab_size, ")"), absl::StrCat(id));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
