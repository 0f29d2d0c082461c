#include "tests/integration/sampled_output_match.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"

namespace tandem::testing {
namespace {

std::string Tokens(const std::vector<int32_t>& t) {
  std::string s = "{";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? ", " : " ") + std::to_string(t[i]);
  return s + " }";
}

std::string Num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
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

// One run's draw at one position, recomputed as Sampler::Sample draws (sampler.h, step 4)
// from its listed top log-probabilities: the kept tokens in canonical order and the
// cumulative probability after each, relative to the kept mass.
struct DrawIntervals {
  std::vector<int32_t> ids;
  std::vector<double> upper;  // token ids[j] is drawn for u in [upper[j - 1], upper[j])
  std::string error;          // the kept set cannot be recomputed from the list

  // How far u lies from the interval of `token` (0 inside it); infinity when the token
  // is not kept.
  double Distance(double u, int32_t token) const {
    for (size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] != token) continue;
      const double lo = j == 0 ? 0.0 : upper[j - 1];
      return u < lo ? lo - u : (u >= upper[j] ? u - upper[j] : 0.0);
    }
    return std::numeric_limits<double>::infinity();
  }
  std::string Describe() const {
    std::string s;
    for (size_t j = 0; j < ids.size(); ++j) s += " " + std::to_string(ids[j]) + " < " + Num(upper[j]);
    return s;
  }
};

DrawIntervals Intervals(const v1::TokenLogprob& lp, const SampledDraw& d) {
  DrawIntervals r;
  std::vector<std::pair<float, int32_t>> top;  // canonical order: logprob descending, id ascending
  for (const v1::TopLogprob& t : lp.top()) top.emplace_back(t.logprob(), t.token_id());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const size_t listed = top.size();
  if (d.top_k <= 0 || static_cast<size_t>(d.top_k) > listed) {
    r.error = "the draw's kept set is not within the " + std::to_string(listed) +
              " listed log-probabilities (top_k " + std::to_string(d.top_k) + ")";
    return r;
  }
  const size_t k = static_cast<size_t>(d.top_k);
  const double inv_t = 1.0 / d.temperature;
  std::vector<double> w(k);
  for (size_t i = 0; i < k; ++i) w[i] = std::exp((static_cast<double>(top[i].first) - top[0].first) * inv_t);
  double top_k_mass = 0;
  for (double x : w) top_k_mass += x;
  // min-p drops a suffix (weights relative to the most likely token's, which is 1), then
  // top-p keeps the shortest prefix reaching top_p of the top-k mass.
  size_t n = k;
  if (d.min_p > 0.0f) {
    n = 0;
    while (n < k && w[n] >= d.min_p) ++n;
  }
  double kept = 0;
  size_t m = 0;
  for (; m < n; ++m) {
    kept += w[m];
    if (d.top_p < 1.0f && kept >= static_cast<double>(d.top_p) * top_k_mass) {
      ++m;
      break;
    }
  }
  double cum = 0;
  for (size_t j = 0; j < m; ++j) {
    cum += w[j];
    r.ids.push_back(top[j].second);
    r.upper.push_back(cum / kept);
  }
  return r;
}

std::string Table(const v1::TokenLogprob& x, const v1::TokenLogprob& y) {
  std::string table;
  for (const v1::TopLogprob& p : y.top()) {
    table += " " + std::to_string(p.token_id()) + ": " + Num(p.logprob());
    for (const v1::TopLogprob& q : x.top()) {
      if (q.token_id() == p.token_id()) table += " vs " + Num(q.logprob());
    }
  }
  return table;
}

}  // namespace

std::optional<SampledDraw> DrawOf(const v1::GenerateRequest& request) {
  const v1::SamplingParams& s = request.sampling();
  const float temperature = s.has_temperature() ? s.temperature() : 1.0f;
  if (temperature < kGreedyTemperature) return std::nullopt;
  return SampledDraw{.seed = s.has_seed() ? s.seed() : 0,
                     .temperature = temperature,
                     .top_k = s.has_top_k() ? s.top_k() : 0,
                     .top_p = s.has_top_p() ? s.top_p() : 1.0f,
                     .min_p = s.has_min_p() ? s.min_p() : 0.0f};
}

double BoundaryEpsilon(float tolerance, float temperature) {
  return static_cast<double>(tolerance) / (2.0 * static_cast<double>(temperature));
}

OutputMatch MatchOutputs(const std::optional<SampledDraw>& sampled, const std::vector<int32_t>& got_tokens,
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
  if (k >= want_logprobs.size()) {
    m.why += " (no log-probabilities to compare there)";
    return m;
  }
  const bool both = k < got_logprobs.size();
  const v1::TokenLogprob& y = want_logprobs[k];
  const std::string table = both ? Table(got_logprobs[k], y) : Table(y, y);
  if (both && (!Agrees(got_logprobs[k], y, tolerance) || !Agrees(y, got_logprobs[k], tolerance))) {
    m.why += " where the distributions differ:" + table;
    return m;
  }
  const int64_t step = sampled->first_step + static_cast<int64_t>(k);
  const double u = UniformFromSeedStep(sampled->seed, step);
  const double epsilon = BoundaryEpsilon(tolerance, sampled->temperature);
  const int32_t got = got_tokens[k], want = want_tokens[k];
  const std::string where = " (draw u = " + Num(u) + " at output position " + std::to_string(step) + ")";
  // Each run's token under its own distribution, then the other run's token under it.
  struct Run {
    const v1::TokenLogprob* lp;
    int32_t own, other;
    const char* name;
  };
  std::vector<Run> runs = {{&y, want, got, "want"}};
  if (both) runs.push_back({&got_logprobs[k], got, want, "got"});
  std::vector<DrawIntervals> intervals;
  for (const Run& r : runs) {
    intervals.push_back(Intervals(*r.lp, *sampled));
    const DrawIntervals& iv = intervals.back();
    if (!iv.error.empty()) {
      m.why += where + ": " + iv.error;
      return m;
    }
    const double own = iv.Distance(u, r.own);
    if (own > kOwnDrawEpsilon) {
      m.why += where + ": " + r.name + "'s token " + std::to_string(r.own) + " is not its own distribution's draw (" +
               Num(own) + " from its interval;" + iv.Describe() + ")";
      return m;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const double other = intervals[i].Distance(u, runs[i].other);
    if (other > epsilon) {
      m.why += where + ": the draw is " + Num(other) + " from the interval of token " + std::to_string(runs[i].other) +
               " under " + runs[i].name + "'s distribution, more than the " + Num(epsilon) +
               " rounding can move a boundary (" + intervals[i].Describe() + ")";
      return m;
    }
  }
  m.same = true;
  m.note = "parts at token " + std::to_string(k) + " (" + std::to_string(got) + " vs " + std::to_string(want) + ")" +
           where + ", on the boundary between them:" + table;
  return m;
}

}  // namespace tandem::testing
