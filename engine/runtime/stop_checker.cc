#include "engine/runtime/stop_checker.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "kernels/common/check.h"

namespace tandem {

StopChecker::StopChecker(const Tokenizer& tokenizer, StopParams params,
                         std::vector<int32_t> eos_ids)
    : params_(std::move(params)),
      eos_ids_(eos_ids.begin(), eos_ids.end()),
      stop_token_ids_(params_.stop_token_ids.begin(), params_.stop_token_ids.end()),
      detokenizer_(tokenizer, params_.skip_special_tokens) {
  TANDEM_CHECK(params_.max_tokens >= 1 && params_.min_tokens >= 0) << "invalid StopParams";
  for (const std::string& s : params_.stop) {
    TANDEM_CHECK(!s.empty()) << "empty stop string";
    max_stop_bytes_ = std::max(max_stop_bytes_, s.size());
  }
}

StopResult StopChecker::OnToken(int32_t token) {
  TANDEM_CHECK(!done_) << "OnToken after the sequence finished";
  const int32_t n = ++num_tokens_;
  StopResult result;
  if (n > params_.min_tokens) {
    if (!params_.ignore_eos && eos_ids_.contains(token)) {
      Finish(FinishReason::kStop, &result);
      return result;
    }
    if (stop_token_ids_.contains(token)) {
      result.matched_stop_token = token;
      Finish(FinishReason::kStop, &result);
      return result;
    }
  }
  const bool match_stops = n >= params_.min_tokens;
  if (AppendText(detokenizer_.Push(token), match_stops, &result)) return result;
  if (n >= params_.max_tokens) {
    Finish(FinishReason::kLength, &result);
    return result;
  }
  result.text_delta = EmitUpTo(HoldBackStart());
  return result;
}

std::string StopChecker::Flush() {
  if (done_) return "";
  done_ = true;
  StopResult result;
  if (AppendText(detokenizer_.Finish(), num_tokens_ >= params_.min_tokens, &result)) {
    return std::move(result.text_delta);
  }
  return EmitUpTo(text_.size());
}

void StopChecker::Finish(FinishReason reason, StopResult* result) {
  done_ = true;
  if (AppendText(detokenizer_.Finish(), /*match_stops=*/true, result)) return;
  result->text_delta = EmitUpTo(text_.size());
  result->finished = true;
  result->reason = reason;
}

bool StopChecker::AppendText(const std::string& text, bool match_stops, StopResult* result) {
  const size_t old_size = text_.size();
  text_ += text;
  if (!match_stops || text.empty()) return false;
  // Occurrences that end in the new text; earlier ones were matched (or suppressed by
  // min_tokens) before. For each stop string the first such occurrence is the one that
  // ends first; across strings, the earliest end, then the earliest start.
  const std::string* best = nullptr;
  size_t best_start = 0;
  size_t best_end = 0;
  for (const std::string& s : params_.stop) {
    const size_t from = old_size >= s.size() - 1 ? old_size - (s.size() - 1) : 0;
    const size_t start = text_.find(s, from);
    if (start == std::string::npos) continue;
    const size_t end = start + s.size();
    if (best == nullptr || end < best_end || (end == best_end && start < best_start)) {
      best = &s;
      best_start = start;
      best_end = end;
    }
  }
  if (best == nullptr) return false;
  const size_t cut = params_.include_stop_str_in_output ? best_end : best_start;
  TANDEM_CHECK(cut >= emitted_) << "a stop string begins in text already emitted";
  result->text_delta = EmitUpTo(cut);
  result->finished = true;
  result->reason = FinishReason::kStop;
  result->matched_stop = *best;
  done_ = true;
  return true;
}

size_t StopChecker::HoldBackStart() const {
  if (max_stop_bytes_ == 0 || params_.include_stop_str_in_output) return text_.size();
  // The earliest position whose suffix is a proper prefix of some stop string.
  const size_t window = std::min(text_.size(), max_stop_bytes_ - 1);
  for (size_t i = std::max(emitted_, text_.size() - window); i < text_.size(); ++i) {
    const std::string_view tail = std::string_view(text_).substr(i);
    for (const std::string& s : params_.stop) {
      if (s.size() > tail.size() && std::string_view(s).starts_with(tail)) return i;
    }
  }
  return text_.size();
}

std::string StopChecker::EmitUpTo(size_t end) {
  TANDEM_CHECK(end >= emitted_ && end <= text_.size()) << end << " " << emitted_;
  std::string delta = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  // Keep max_stop_bytes_ - 1 emitted bytes: a stop string may begin there.
  const size_t keep = max_stop_bytes_ > 0 ? max_stop_bytes_ - 1 : 0;
  const size_t drop = text_.size() > keep ? std::min(emitted_, text_.size() - keep) : 0;
  if (drop > 0) {
    text_.erase(0, drop);
    emitted_ -= drop;
  }
  return delta;
}

}  // namespace tandem
