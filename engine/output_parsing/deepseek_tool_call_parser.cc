#include "engine/output_parsing/deepseek_tool_call_parser.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/output_parsing/marker_matching.h"

namespace tandem::output_parsing {
namespace {

constexpr std::string_view kOpenFence = "```json";
constexpr std::string_view kCloseFence = "```";
// A function name or type longer than this is not one: the call is malformed. (OpenAI
// allows names of 64 characters; this leaves room without holding text back for long.)
constexpr size_t kMaxHeaderBytes = 256;

// abseil here has its own string_view; StrCat takes that one.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// A name or type: non-empty, no whitespace, control characters or '<'.
bool IsValidIdentifier(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == '<' || c == 0x7F) return false;
  }
  return true;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

void AppendPiece(ToolParseOutput* out, int index, std::string_view name, std::string_view args) {
  if (out->calls.empty() || out->calls.back().index != index) {
    out->calls.push_back(ToolCallDelta{index, "", std::string(name), ""});
  }
  out->calls.back().arguments.append(args);
}

[[noreturn]] void FedAfterFinish() {
  std::fprintf(stderr, "output_parsing: ToolCallParser::Feed after Finish\n");
  std::fflush(stderr);
  std::abort();
}

}  // namespace

void DeepSeekToolCallParser::Feed(std::string_view text, ToolParseOutput* out) {
  if (finished_) FedAfterFinish();
  buf_.append(text);
  while (Step(out)) {
  }
  buf_.erase(0, pos_);
  pos_ = 0;
}

ToolCallOutcome DeepSeekToolCallParser::Finish(ToolParseOutput* out) {
  if (!finished_) {
    finished_ = true;
    switch (state_) {
      case State::kText:
      case State::kPassthrough:
        out->content.append(Rest());  // a marker that never completed is content
        break;
      case State::kSection:
        if (!section_has_complete_call_) {
          Fail(absl::StatusCode::kOutOfRange, "the output ended in a tool-call section before any call", out);
        } else if (!Rest().empty()) {
          out->content.append(raw_);
          out->content.append(Rest());
        }
        break;
      default:
        Fail(absl::StatusCode::kOutOfRange, "the output ended inside the call", out);
        break;
    }
    buf_.clear();
    pos_ = 0;
  }
  return ToolCallOutcome{complete_, status_};
}

bool DeepSeekToolCallParser::Step(ToolParseOutput* out) {
  switch (state_) {
    case State::kText: return StepText(out);
    case State::kSection: return StepSection(out);
    case State::kCallType: return StepCallType(out);
    case State::kCallName: return StepCallName(out);
    case State::kFence: return StepFence(out);
    case State::kArguments: return StepArguments(out);
    case State::kAfterArguments: return StepAfterArguments(out);
    case State::kPassthrough:
      out->content.append(Rest());
      pos_ = buf_.size();
      return false;
  }
  return false;
}

void DeepSeekToolCallParser::Consume(size_t n) {
  raw_.append(buf_, pos_, n);
  pos_ += n;
}

bool DeepSeekToolCallParser::SkipWhitespace() {
  size_t n = 0;
  const std::string_view rest = Rest();
  while (n < rest.size() && IsSpace(rest[n])) ++n;
  Consume(n);
  return pos_ < buf_.size();
}

void DeepSeekToolCallParser::StartCall() {
  current_ = static_cast<int>(complete_.size());
  state_ = format_ == DeepSeekToolFormat::kV3 ? State::kCallType : State::kCallName;
}

void DeepSeekToolCallParser::EmitArguments(std::string_view fragment, ToolParseOutput* out) {
  if (!fragment.empty()) AppendPiece(out, current_, "", fragment);
}

void DeepSeekToolCallParser::Fail(absl::StatusCode code, std::string_view why, ToolParseOutput* out) {
  if (status_.ok()) {
    const bool in_call = state_ != State::kSection && state_ != State::kText;
    status_ = absl::Status(code, in_call ? absl::StrCat("tool call ", current_, ": ", A(why))
                                         : absl::StrCat("tool calls: ", A(why)));
  }
  out->content.append(raw_);
  out->content.append(Rest());
  raw_.clear();
  pos_ = buf_.size();
  state_ = State::kPassthrough;
}

bool DeepSeekToolCallParser::StepText(ToolParseOutput* out) {
  const std::string_view rest = Rest();
  const size_t section = rest.find(kDeepSeekToolCallsBegin);
  const size_t call = rest.find(kDeepSeekToolCallBegin);
  const size_t at = std::min(section, call);
  if (at == std::string_view::npos) {
    const size_t keep = PartialMarkerSuffix(rest, {kDeepSeekToolCallsBegin, kDeepSeekToolCallBegin});
    out->content.append(rest.substr(0, rest.size() - keep));
    pos_ += rest.size() - keep;
    return false;
  }
  out->content.append(rest.substr(0, at));
  pos_ += at;
  raw_.clear();
  section_has_complete_call_ = false;
  if (at == section) {
    Consume(kDeepSeekToolCallsBegin.size());
    state_ = State::kSection;
  } else {
    Consume(kDeepSeekToolCallBegin.size());
    StartCall();
  }
  return true;
}

bool DeepSeekToolCallParser::StepSection(ToolParseOutput* out) {
  if (!SkipWhitespace()) return false;
  const std::string_view rest = Rest();
  if (StartsWith(rest, kDeepSeekToolCallBegin)) {
    Consume(kDeepSeekToolCallBegin.size());
    StartCall();
    return true;
  }
  if (StartsWith(rest, kDeepSeekToolCallsEnd)) {
    Consume(kDeepSeekToolCallsEnd.size());
    raw_.clear();
    state_ = State::kText;
    return true;
  }
  if (IsProperPrefixOf(rest, kDeepSeekToolCallBegin) || IsProperPrefixOf(rest, kDeepSeekToolCallsEnd)) {
    return false;
  }
  Fail(absl::StatusCode::kInvalidArgument,
       absl::StrCat("expected ", A(kDeepSeekToolCallBegin), " or ", A(kDeepSeekToolCallsEnd)), out);
  return false;
}

bool DeepSeekToolCallParser::StepCallType(ToolParseOutput* out) {
  const std::string_view rest = Rest();
  const size_t sep = rest.find(kDeepSeekToolSep);
  const std::string_view type =
      sep == std::string_view::npos ? rest.substr(0, rest.size() - PartialMarkerSuffix(rest, kDeepSeekToolSep))
                                    : rest.substr(0, sep);
  const bool bad = type.find_first_of("<\n") != std::string_view::npos || type.size() > kMaxHeaderBytes ||
                   (sep != std::string_view::npos && !IsValidIdentifier(Trim(type)));
  if (bad) {
    Fail(absl::StatusCode::kInvalidArgument, absl::StrCat("expected a type, then ", A(kDeepSeekToolSep)), out);
    return false;
  }
  if (sep == std::string_view::npos) return false;
  Consume(sep + kDeepSeekToolSep.size());
  state_ = State::kCallName;
  return true;
}

bool DeepSeekToolCallParser::StepCallName(ToolParseOutput* out) {
  const std::string_view rest = Rest();
  const bool v3 = format_ == DeepSeekToolFormat::kV3;
  const std::string_view end_marker = v3 ? std::string_view("\n") : kDeepSeekToolSep;
  const size_t end = rest.find(end_marker);
  std::string_view name = end == std::string_view::npos
                              ? rest.substr(0, rest.size() - PartialMarkerSuffix(rest, end_marker))
                              : rest.substr(0, end);
  const bool bad = name.find_first_of(v3 ? "<" : "<\n") != std::string_view::npos ||
                   name.size() > kMaxHeaderBytes ||
                   (end != std::string_view::npos && !IsValidIdentifier(Trim(name)));
  if (bad) {
    Fail(absl::StatusCode::kInvalidArgument,
         absl::StrCat("expected a function name, then ", v3 ? absl::string_view("a newline") : A(kDeepSeekToolSep)), out);
    return false;
  }
  if (end == std::string_view::npos) return false;
  name = Trim(name);
  complete_.push_back(false);
  AppendPiece(out, current_, name, "");
  Consume(end + end_marker.size());
  json_ = JsonPrefixScanner();
  state_ = v3 ? State::kFence : State::kArguments;
  return true;
}

bool DeepSeekToolCallParser::StepFence(ToolParseOutput* out) {
  if (!SkipWhitespace()) return false;
  const std::string_view rest = Rest();
  if (StartsWith(rest, kOpenFence)) {
    Consume(kOpenFence.size());
    state_ = State::kArguments;
    return true;
  }
  if (IsProperPrefixOf(rest, kOpenFence)) return false;
  Fail(absl::StatusCode::kInvalidArgument, absl::StrCat("expected ", A(kOpenFence), " before the arguments"), out);
  return false;
}

bool DeepSeekToolCallParser::StepArguments(ToolParseOutput* out) {
  const std::string_view rest = Rest();
  size_t fragment_start = 0;  // of the bytes read this step, where the emitted ones begin
  size_t i = 0;
  for (; i < rest.size(); ++i) {
    const char c = rest[i];
    if (c == kDeepSeekToolCallEnd.front()) {
      const std::string_view tail = rest.substr(i);
      if (IsProperPrefixOf(tail, kDeepSeekToolCallEnd)) break;  // wait: a marker may be starting
      if (StartsWith(tail, kDeepSeekToolCallEnd)) {
        EmitArguments(rest.substr(fragment_start, i - fragment_start), out);
        Consume(i);
        Fail(absl::StatusCode::kInvalidArgument,
             absl::StrCat(A(kDeepSeekToolCallEnd), " before the arguments' JSON object is complete"), out);
        return false;
      }
    }
    const bool was_started = json_.started();
    if (!json_.Feed(c)) {
      EmitArguments(rest.substr(fragment_start, i - fragment_start), out);
      Consume(i);
      Fail(absl::StatusCode::kInvalidArgument, absl::StrCat("the arguments are not valid JSON: ", json_.error()),
           out);
      return false;
    }
    if (!was_started) {
      if (!json_.started()) {
        fragment_start = i + 1;  // leading whitespace is not part of the arguments
        continue;
      }
      if (json_.first_byte() != '{') {
        Consume(i);
        Fail(absl::StatusCode::kInvalidArgument, "the arguments are not a JSON object", out);
        return false;
      }
    }
    if (json_.complete()) {
      EmitArguments(rest.substr(fragment_start, i + 1 - fragment_start), out);
      Consume(i + 1);
      fence_closed_ = false;
      state_ = State::kAfterArguments;
      return true;
    }
  }
  EmitArguments(rest.substr(fragment_start, i - fragment_start), out);
  Consume(i);
  return false;
}

bool DeepSeekToolCallParser::StepAfterArguments(ToolParseOutput* out) {
  if (!SkipWhitespace()) return false;
  const std::string_view rest = Rest();
  const bool fence_allowed = format_ == DeepSeekToolFormat::kV3 && !fence_closed_;
  if (fence_allowed && StartsWith(rest, kCloseFence)) {
    Consume(kCloseFence.size());
    fence_closed_ = true;
    return true;
  }
  if (StartsWith(rest, kDeepSeekToolCallEnd)) {
    Consume(kDeepSeekToolCallEnd.size());
    complete_[current_] = true;
    section_has_complete_call_ = true;
    raw_.clear();
    state_ = State::kSection;
    return true;
  }
  if (IsProperPrefixOf(rest, kDeepSeekToolCallEnd) || (fence_allowed && IsProperPrefixOf(rest, kCloseFence))) {
    return false;
  }
  Fail(absl::StatusCode::kInvalidArgument,
       absl::StrCat("unexpected text after the arguments (expected ", A(kDeepSeekToolCallEnd), ")"), out);
  return false;
}

}  // namespace tandem::output_parsing
