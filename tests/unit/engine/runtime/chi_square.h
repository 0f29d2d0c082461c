// Pearson's chi-square tests for the sampling tests (sampler_verify_test.cc, the engine's
// speculative distribution test): the survival function written from scratch, pooling of
// small cells, goodness of fit to exact probabilities and homogeneity of two samples.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace tandem::chi_square {

// Q(a, x) = Γ(a, x) / Γ(a), the regularized upper incomplete gamma function. Below
// x = a + 1 the power series of P = 1 - Q converges fast (and Q is not small there, so
// 1 - P loses nothing); above, the continued fraction of Q does, evaluated with the
// modified Lentz method, which keeps Q's relative accuracy deep in the tail (the biased
// rules below give p-values far under 1e-6).
inline double UpperRegularizedGamma(double a, double x) {
  if (x <= 0.0) return 1.0;
  constexpr double kEps = 1e-16;
  constexpr int kMaxTerms = 100000;
  const double log_prefix = a * std::log(x) - x - std::lgamma(a);  // log(x^a e^-x / Γ(a))
  if (x < a + 1.0) {
    // P(a, x) = x^a e^-x / Γ(a) * sum_{n >= 0} x^n / (a (a + 1) ... (a + n)).
    double term = 1.0 / a;
    double sum = term;
    for (int n = 1; n < kMaxTerms && term > sum * kEps; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - std::exp(log_prefix) * sum;
  }
  // Q(a, x) = x^a e^-x / Γ(a) / f, f = b_0 + a_1 / (b_1 + a_2 / (b_2 + ...)) with
  // b_n = x + 2n + 1 - a and a_n = -n (n - a) (Legendre's continued fraction).
  constexpr double kTiny = 1e-300;
  double f = x + 1.0 - a;
  if (f == 0.0) f = kTiny;
  double c = f;
  double d = 0.0;
  for (int n = 1; n < kMaxTerms; ++n) {
    const double an = -n * (n - a);
    const double bn = x + 2.0 * n + 1.0 - a;
    d = bn + an * d;
    if (std::abs(d) < kTiny) d = kTiny;
    c = bn + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = c * d;
    f *= delta;
    if (std::abs(delta - 1.0) < kEps) break;
  }
  return std::exp(log_prefix) / f;
}

// P(X >= statistic) for X chi-square distributed with `df` degrees of freedom.
inline double ChiSquareSurvival(double statistic, double df) {
  return UpperRegularizedGamma(df / 2.0, statistic / 2.0);
}

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
  double p_value = 1.0;
};

// Pearson's statistic over the cells of one or two rows of observed counts with their
// expected counts. A cell whose expectation (the smallest of its rows') is below 5 goes
// into one pooled cell; a pool still below 5 joins the smallest other cell. Cells of
// expectation 0 are left out by the caller. df = pooled cells - 1, which is right both
// for goodness of fit to given probabilities (one row) and for homogeneity of two samples
// ((2 - 1) (cells - 1)).
inline ChiSquare Pearson(const std::vector<std::vector<double>>& observed,
                  const std::vector<std::vector<double>>& expected) {
  const size_t cells = expected[0].size();
  std::vector<double> smallest(cells, std::numeric_limits<double>::infinity());
  for (const std::vector<double>& row : expected) {
    for (size_t i = 0; i < cells; ++i) smallest[i] = std::min(smallest[i], row[i]);
  }
  // group[i]: the pooled cell of cell i; the pool is group 0 when used.
  std::vector<int> group(cells, -1);
  double pool = 0.0;
  for (size_t i = 0; i < cells; ++i) {
    if (smallest[i] < 5.0) pool += smallest[i];
  }
  int groups = pool > 0.0 ? 1 : 0;
  for (size_t i = 0; i < cells; ++i) group[i] = smallest[i] < 5.0 ? 0 : groups++;
  if (pool > 0.0 && pool < 5.0 && groups > 1) {
    size_t smallest_large = cells;
    for (size_t i = 0; i < cells; ++i) {
      if (group[i] > 0 && (smallest_large == cells || smallest[i] < smallest[smallest_large])) {
        smallest_large = i;
      }
    }
    // Renumber so that groups stay 0 .. groups - 2.
    const int merged = group[smallest_large];
    for (int& g : group) {
      if (g == merged) {
        g = 0;
      } else if (g > merged) {
        --g;
      }
    }
    --groups;
  }
  ChiSquare result;
  for (size_t r = 0; r < expected.size(); ++r) {
    std::vector<double> o(groups, 0.0);
    std::vector<double> e(groups, 0.0);
    for (size_t i = 0; i < cells; ++i) {
      o[group[i]] += observed[r][i];
      e[group[i]] += expected[r][i];
    }
    for (int g = 0; g < groups; ++g) result.statistic += (o[g] - e[g]) * (o[g] - e[g]) / e[g];
  }
  result.df = groups - 1;
  result.p_value = result.df > 0 ? ChiSquareSurvival(result.statistic, result.df) : 1.0;
  return result;
}

// Counts against exact probabilities. A count where the probability is 0 is an
// impossible outcome: p-value 0.
inline ChiSquare GoodnessOfFit(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  std::vector<double> observed;
  std::vector<double> expected;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] > 0.0) {
      observed.push_back(static_cast<double>(counts[i]));
      expected.push_back(probs[i] * n);
    } else if (counts[i] > 0) {
      return ChiSquare{std::numeric_limits<double>::infinity(), 0, 0.0};
    }
  }
  return Pearson({observed}, {expected});
}

// Two samples of the same categorical distribution?
inline ChiSquare Homogeneity(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const double na = std::accumulate(a.begin(), a.end(), 0.0);
  const double nb = std::accumulate(b.begin(), b.end(), 0.0);
  std::vector<std::vector<double>> observed(2);
  std::vector<std::vector<double>> expected(2);
  for (size_t i = 0; i < a.size(); ++i) {
    const double total = static_cast<double>(a[i] + b[i]);
    if (total == 0.0) continue;
    observed[0].push_back(static_cast<double>(a[i]));
    observed[1].push_back(static_cast<double>(b[i]));
    expected[0].push_back(total * na / (na + nb));
    expected[1].push_back(total * nb / (na + nb));
  }
  return Pearson(observed, expected);
}

}  // namespace tandem::chi_square
