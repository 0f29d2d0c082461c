#include "cli/bench/sse_parser.h"

namespace tandem::cli {

void SseParser::Feed(std::string_view bytes, const std::function<void(const std::string&)>& on_event) {
  for (const char c : bytes) {
    if (c == '\n' && after_cr_) {
      after_cr_ = false;
      continue;
    }
    after_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      EndLine(on_event);
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::EndLine(const std::function<void(const std::string&)>& on_event) {
  if (line_.empty()) {
    if (has_data_) {
      std::string payload = std::move(data_);
      data_.clear();
      has_data_ = false;
      on_event(payload);
    }
    return;
  }
  std::string_view line = line_;
  if (line.front() != ':') {
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    }
  }
  line_.clear();
}

}  // namespace tandem::cli
