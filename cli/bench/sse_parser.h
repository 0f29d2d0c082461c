// Server-sent events split out of a byte stream as it arrives (the EventSource format of
// the WHATWG HTML standard, as the OpenAI-compatible APIs stream): lines end in LF, CR
// or CRLF; an empty line ends an event; its `data:` lines, joined by LF, are its payload;
// comments (":...") and other fields are skipped. Bytes may come split anywhere.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tandem::cli {

class SseParser {
 public:
  // Parses `bytes` and calls on_event with the payload of every event they complete, in
  // order. An event without data lines is not passed on.
  void Feed(std::string_view bytes, const std::function<void(const std::string&)>& on_event);

  // Whether bytes of an unfinished event are held (a stream that ends here was cut).
  bool pending() const { return !line_.empty() || has_data_; }

 private:
  void EndLine(const std::function<void(const std::string&)>& on_event);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was CR: an LF next ends nothing more
};

}  // namespace tandem::cli
