#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/strings.h"
#include "engine/tokenizer/unicode_additions.h"
#include "engine/tokenizer/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// Unicode White_Space, written for use inside a character class.
constexpr std::string_view kWhiteSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view kHexDigitClassBody = "0-9a-fA-F";

// Per-thread match state: match data and a JIT stack that may grow for long subjects.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    pcre2_set_heap_limit(context, 1u << 22);  // in KiB: 4 GiB (the depth limit binds first)
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

// The backtracking budget of one pcre2_match call over `remaining` bytes (match limit
// and depth limit alike): linear in the bytes, so that the patterns tokenizers use, which
// do a bounded amount of work per character, never reach it, while a pattern that
// backtracks catastrophically (exponential in the input) stops in a few seconds at most
// with an error instead of running for hours.
uint32_t MatchBudget(size_t remaining) {
  const uint64_t budget = Regex::kMatchLimitBase + Regex::kMatchLimitPerByte * static_cast<uint64_t>(remaining);
  return static_cast<uint32_t>(std::min<uint64_t>(budget, UINT32_MAX));
}

void SetBudget(ThreadMatchState& state, size_t remaining) {
  const uint32_t budget = MatchBudget(remaining);
  pcre2_set_match_limit(state.context, budget);
  pcre2_set_depth_limit(state.context, budget);
}

// Class members (for use inside [...]) of what Unicode 15.0-16.0 added to `category`.
std::string AdditionsClassBody(std::string_view category) {
  std::string body;
  for (const CodePointRange& range : UnicodeAdditions(category)) {
    absl::StrAppend(&body, "\\x{", absl::Hex(range.lo), "}");
    if (range.hi != range.lo) absl::StrAppend(&body, "-\\x{", absl::Hex(range.hi), "}");
  }
  return body;
}

}  // namespace

std::string Regex::TranslateOniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size() && (pattern[i + 1] == 'p' || pattern[i + 1] == 'P') &&
        i + 2 < pattern.size() && pattern[i + 2] == '{') {
      const size_t close = pattern.find('}', i + 3);
      if (close != std::string_view::npos) {
        std::string_view name = pattern.substr(i + 3, close - (i + 3));
        bool negated = pattern[i + 1] == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        const std::string additions = AdditionsClassBody(name);
        const std::string property = absl::StrCat("\\p{", AsAbsl(name), "}");
        if (additions.empty() || (negated && class_depth > 0)) {
          out += pattern.substr(i, close + 1 - i);
        } else if (class_depth > 0) {
          out += property + additions;
        } else {
          out += absl::StrCat(negated ? "[^" : "[", property, additions, "]");
        }
        i = close;
        continue;
      }
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      std::string_view body;
      bool negated = false;
      switch (e) {
        case 's':
          body = kWhiteSpaceClassBody;
          break;
        case 'S':
          body = kWhiteSpaceClassBody;
          negated = true;
          break;
        case 'h':
          body = kHexDigitClassBody;
          break;
        case 'H':
          body = kHexDigitClassBody;
          negated = true;
          break;
        default:
          break;
      }
      if (body.empty() || (negated && class_depth > 0)) {
        // Copied as is (a negated class cannot be spliced into another class).
        out += c;
        out += e;
      } else if (class_depth > 0) {
        out += body;
      } else {
        out += negated ? "[^" : "[";
        out += body;
        out += ']';
      }
      ++i;
      continue;
    }
    if (c == '[') {
      if (pattern.substr(i, 2) == "[:" && class_depth > 0) {
        // A POSIX class such as [:alpha:] inside a bracket expression.
        const size_t close = pattern.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out += pattern.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

std::string Regex::Escape(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    const bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    if (u < 0x80 && !alnum) {
      if (u < 0x20 || u == 0x7F) {
        absl::StrAppend(&out, "\\x{", absl::Hex(u), "}");
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string translated = TranslateOniguruma(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("invalid regex '", AsAbsl(pattern),
                                                   "': ", reinterpret_cast<const char*>(message),
                                                   " at offset ", error_offset));
  }
  // JIT is an optimization only; without it the interpreter gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::FindAll(std::string_view subject) const {
  std::vector<std::pair<size_t, size_t>> matches;
  ThreadMatchState& state = MatchState();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t search_from = 0;
  bool have_last_end = false;
  size_t last_end = 0;
  while (search_from <= subject.size()) {
    SetBudget(state, subject.size() - search_from);
    // The subject is valid UTF-8 and search_from is on a character boundary.
    const int rc = pcre2_match(static_cast<pcre2_code*>(code_), data, subject.size(), search_from,
                               PCRE2_NO_UTF_CHECK, state.match_data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokenizer's pre-tokenization pattern '", AsAbsl(pattern_), "' gave up at byte ", search_from, " of a ",
          subject.size(), "-byte piece: ", reinterpret_cast<const char*>(message),
          " (the input makes the pattern backtrack without bound)"));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && have_last_end && last_end == end) {
      // No empty match right after the previous match: step over one character.
      search_from += search_from < subject.size()
                         ? Utf8SequenceLength(static_cast<uint8_t>(subject[search_from]))
                         : 1;
      continue;
    }
    matches.emplace_back(start, end);
    search_from = end;
    last_end = end;
    have_last_end = true;
  }
  return matches;
}

bool Regex::MatchesPrefix(std::string_view subject) const {
  ThreadMatchState& state = MatchState();
  SetBudget(state, subject.size());
  const int rc = pcre2_match(static_cast<pcre2_code*>(code_),
                             reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                             PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, state.match_data, state.context);
  return rc >= 0;
}

}  // namespace tandem::tokenizer_internal
