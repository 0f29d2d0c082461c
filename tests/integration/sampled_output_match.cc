#include "tests/integration/sampled_output_match.h"

#include <algorithm>
#include <cmath>

namespace tandem::testing {
namespace {

std::string Tokens(const std::vector<int32_t>& t) {
  std::string s = "{";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? ", " : " ") + std::to_string(t[i]);
  return s + " }";
}

// Every top token of `from` within `tolerance` of its log-probability in `in`, or, missing
// from `in`'s list, no more than `tolerance` above that list's last entry.
bool Agrees(const v1::TokenLogprob& from, const v1::TokenLogprob& in, float tolerance) {
  if (from.top_size() == 0 || in.top_size() == 0) return false;
  float last = in.top(0).logprob();
  for (const v1::TopLogprob& q : in.top()) last = std::min(last, q.logprob());
  for (const v1::TopLogprob& p : from.top()) {
    const v1::TopLogprob* match = nullptr;
    for (const v1::TopLogprob& q : in.top()) {
      if (q.token_id() == p.token_id()) match = &q;
    }
    const bool ok = match != nullptr ? std::fabs(match->logprob() - p.logprob()) <= tolerance
                                     : p.logprob() <= last + tolerance;
    if (!ok) return false;
  }
  return true;
}

}  // namespace

OutputMatch MatchOutputs(bool sampled, const std::vector<int32_t>& got_tokens,
                         const std::vector<v1::TokenLogprob>& got_logprobs, const std::vector<int32_t>& want_tokens,
                         const std::vector<v1::TokenLogprob>& want_logprobs, float tolerance) {
  OutputMatch m;
  if (got_tokens == want_tokens) {
    m.same = true;
    return m;
  }
  size_t k = 0;
  while (k < got_tokens.size() && k < want_tokens.size() && got_tokens[k] == want_tokens[k]) ++k;
  m.why = "parts at token " + std::to_string(k) + " of " + std::to_string(want_tokens.size()) + ": " +
          Tokens(got_tokens) + " vs " + Tokens(want_tokens);
  if (!sampled) return m;
  if (k >= got_tokens.size() || k >= want_tokens.size()) {
    m.why += " (one output ends early)";
    return m;
  }
  if (k >= got_logprobs.size() || k >= want_logprobs.size()) {
    m.why += " (no log-probabilities to compare there)";
    return m;
  }
  const v1::TokenLogprob& x = got_logprobs[k];
  const v1::TokenLogprob& y = want_logprobs[k];
  std::string table;
  for (const v1::TopLogprob& p : y.top()) {
    table += " " + std::to_string(p.token_id()) + ": " + std::to_string(p.logprob());
    for (const v1::TopLogprob& q : x.top()) {
      if (q.token_id() == p.token_id()) table += " vs " + std::to_string(q.logprob());
    }
  }
  if (!Agrees(x, y, tolerance) || !Agrees(y, x, tolerance)) {
    m.why += " where the distributions differ:" + table;
    return m;
  }
  m.same = true;
  m.note = "parts at token " + std::to_string(k) + " (" + std::to_string(got_tokens[k]) + " vs " +
           std::to_string(want_tokens[k]) + ") on a draw between nearly equal distributions:" + table;
  return m;
}

}  // namespace tandem::testing
