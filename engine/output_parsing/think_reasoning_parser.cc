#include "engine/output_parsing/think_reasoning_parser.h"

#include <cstdio>
#include <cstdlib>

#include "engine/output_parsing/marker_matching.h"

namespace tandem::output_parsing {
namespace {

[[noreturn]] void FedAfterFinish() {
  std::fprintf(stderr, "output_parsing: ReasoningParser::Feed after Finish\n");
  std::fflush(stderr);
  std::abort();
}

}  // namespace

ThinkReasoningParser::ThinkReasoningParser(bool starts_in_reasoning)
    : starts_in_reasoning_(starts_in_reasoning) {}

void ThinkReasoningParser::Feed(std::string_view text, ReasoningSplit* out) {
  if (finished_) FedAfterFinish();
  if (state_ == State::kContent) {
    out->content.append(text);
    return;
  }
  held_.append(text);
  Drain(out);
}

void ThinkReasoningParser::Drain(ReasoningSplit* out) {
  if (state_ == State::kStart) {
    if (IsProperPrefixOf(held_, kThinkOpen)) return;  // may still become "<think>"
    if (held_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
      held_.erase(0, kThinkOpen.size());
      state_ = State::kReasoning;
    } else {
      state_ = starts_in_reasoning_ ? State::kReasoning : State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t close = held_.find(kThinkClose);
    if (close == std::string::npos) {
      const size_t keep = PartialMarkerSuffix(held_, kThinkClose);
      out->reasoning.append(held_, 0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    out->reasoning.append(held_, 0, close);
    held_.erase(0, close + kThinkClose.size());
    state_ = State::kContent;
  }
  out->content.append(held_);
  held_.clear();
}

void ThinkReasoningParser::Finish(ReasoningSplit* out) {
  if (finished_) return;
  finished_ = true;
  // What is held back is a tag that never completed: text of the channel it is in.
  const bool in_reasoning =
      state_ == State::kReasoning || (state_ == State::kStart && starts_in_reasoning_);
  (in_reasoning ? out->reasoning : out->content).append(held_);
  held_.clear();
}

void IdentityReasoningParser::Feed(std::string_view text, ReasoningSplit* out) {
  out->content.append(text);
}

std::unique_ptr<ReasoningParser> MakeDeepSeekR1ReasoningParser(const ReasoningOptions& options) {
  return std::make_unique<ThinkReasoningParser>(options.prompt_ends_in_reasoning.value_or(true));
}

std::unique_ptr<ReasoningParser> MakeDeepSeekV3ReasoningParser(const ReasoningOptions& options) {
  const bool open = options.prompt_ends_in_reasoning.value_or(options.thinking);
  if (!options.thinking && !open) return std::make_unique<IdentityReasoningParser>();
  return std::make_unique<ThinkReasoningParser>(open);
}

bool PromptEndsInsideThink(std::string_view rendered_prompt) {
  const size_t open = rendered_prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = rendered_prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

}  // namespace tandem::output_parsing
