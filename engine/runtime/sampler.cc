#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/check.h"

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// SplitMix64's finalizer: a bijection of 64-bit integers with good avalanche.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Maps floats to unsigned integers with the same order (-0 counts as +0; no NaN).
uint32_t OrderedBits(float x) {
  x += 0.0f;  // -0 -> +0
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Ascending keys are the canonical order: logit descending, then id ascending.
uint64_t CanonicalKey(float logit, size_t id) {
  return (static_cast<uint64_t>(~OrderedBits(logit)) << 32) | static_cast<uint32_t>(id);
}

int32_t KeyId(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

void CheckTokenId(int32_t id, size_t vocab) {
  TANDEM_CHECK(id >= 0 && static_cast<size_t>(id) < vocab)
      << "token id " << id << " outside the vocabulary of " << vocab;
}

// sum_i exp(logits[i] - max), in double.
double SumExp(const float* logits, size_t n, float max) {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(logits[i] - max);
  return sum;
}

// The `count` smallest canonical keys of all logits, sorted: a bounded max-heap, so one
// pass whose common case is a single comparison.
std::vector<uint64_t> TopKeys(const float* logits, size_t vocab, size_t count) {
  std::vector<uint64_t> heap;
  heap.reserve(count + 1);
  for (size_t i = 0; i < vocab; ++i) {
    const uint64_t key = CanonicalKey(logits[i], i);
    if (heap.size() < count) {
      heap.push_back(key);
      std::push_heap(heap.begin(), heap.end());
    } else if (key < heap.front()) {
      std::pop_heap(heap.begin(), heap.end());
      heap.back() = key;
      std::push_heap(heap.begin(), heap.end());
    }
  }
  std::sort(heap.begin(), heap.end());
  return heap;
}

}  // namespace

double UniformFromSeedStep(uint64_t seed, int64_t step) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;  // SplitMix64's increment
  const uint64_t h = Mix64(Mix64(seed + kGamma) ^ (static_cast<uint64_t>(step) + kGamma));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

void SuppressTokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (const int32_t id : ids) {
    CheckTokenId(id, logits.size());
    logits[id] = kNegInf;
  }
}

uint32_t Sampler::NextEpoch(size_t vocab) {
  if (seen_.size() != vocab) {
    seen_.assign(vocab, 0);
    counts_.assign(vocab, 0);
    epoch_ = 0;
  }
  if (++epoch_ == 0) {  // wrapped: old marks could alias the new epoch
    std::fill(seen_.begin(), seen_.end(), 0);
    epoch_ = 1;
  }
  return epoch_;
}

void Sampler::ApplyPenalties(std::span<float> logits, const SamplingParams& p,
                             std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens) {
  const size_t vocab = logits.size();
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    const uint32_t epoch = NextEpoch(vocab);
    for (const std::span<const int32_t> tokens : {prompt_tokens, output_tokens}) {
      for (const int32_t id : tokens) {
        CheckTokenId(id, vocab);
        if (seen_[id] == epoch) continue;
        seen_[id] = epoch;
        float& x = logits[id];
        x = x > 0.0f ? x / r : x * r;
      }
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    const uint32_t epoch = NextEpoch(vocab);
    for (const int32_t id : output_tokens) {
      CheckTokenId(id, vocab);
      if (seen_[id] != epoch) {
        seen_[id] = epoch;
        counts_[id] = 0;
      }
      ++counts_[id];
    }
    // As vLLM: the frequency term, then the presence term, each subtracted in float.
    for (const int32_t id : output_tokens) {
      if (counts_[id] == 0) continue;  // already applied
      float& x = logits[id];
      x -= p.frequency_penalty * static_cast<float>(counts_[id]);
      x -= p.presence_penalty;
      counts_[id] = 0;
    }
  }
}

size_t Sampler::SelectPrefix(size_t n, double target, bool strict, double* mass) {
  // Invariant: keys[0, lo) are the lo first candidates and weigh acc, short of the target;
  // keys[lo, hi) are the next ones (unordered); the answer lies in (lo, hi].
  // The first probe is small (real models put most of the mass on few tokens); after it,
  // bisection, so the total work is O(n).
  constexpr size_t kSortBelow = 128;
  constexpr size_t kFirstProbe = 512;
  uint64_t* keys = keys_.data();
  const float* w = weights_.data();
  const auto reaches = [&](double m) { return strict ? m > target : m >= target; };
  size_t lo = 0;
  size_t hi = n;
  double acc = 0.0;
  size_t probe = kFirstProbe;
  while (hi - lo > kSortBelow) {
    const size_t mid = lo + std::min(probe, (hi - lo) / 2);
    probe = std::numeric_limits<size_t>::max();
    std::nth_element(keys + lo, keys + mid, keys + hi);
    double m = 0.0;
    for (size_t i = lo; i < mid; ++i) m += w[KeyId(keys[i])];
    if (reaches(acc + m)) {
      hi = mid;
    } else {
      acc += m;
      lo = mid;
    }
  }
  std::sort(keys + lo, keys + hi);
  for (size_t i = lo; i < hi; ++i) {
    acc += w[KeyId(keys[i])];
    if (reaches(acc)) {
      *mass = acc;
      return i + 1;
    }
  }
  *mass = acc;
  return hi;
}

SampledToken Sampler::Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                             int64_t step, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens) {
  const size_t vocab = logits.size();
  TANDEM_CHECK(vocab > 0 && vocab <= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      << vocab;
  ApplyPenalties(logits, p, prompt_tokens, output_tokens);
  const float* l = logits.data();

  // Max and argmax (first index wins ties).
  float max = kNegInf;
  size_t argmax = 0;
  for (size_t i = 0; i < vocab; ++i) {
    if (l[i] > max) {
      max = l[i];
      argmax = i;
    }
  }
  TANDEM_CHECK(std::isfinite(max)) << "no finite logit (max " << max << ")";

  SampledToken result;
  double sum_exp = 0.0;  // sum exp(l - max), for the log-softmax
  if (p.temperature < kGreedyTemperature) {
    result.token = static_cast<int32_t>(argmax);
    sum_exp = SumExp(l, vocab, max);
  } else {
    // Weights exp((l - max) / T): the largest is exactly 1. Tokens of weight 0 (masked or
    // underflowed) can never be drawn and are no candidates.
    weights_.resize(vocab);
    keys_.resize(vocab);
    const float inv_t = 1.0f / p.temperature;
    float* w = weights_.data();
    double total = 0.0;
    size_t n = 0;
    for (size_t i = 0; i < vocab; ++i) {
      w[i] = std::exp((l[i] - max) * inv_t);
      total += w[i];
      if (w[i] > 0.0f) keys_[n++] = CanonicalKey(l[i], i);
    }
    sum_exp = inv_t == 1.0f ? total : SumExp(l, vocab, max);

    // top-k
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
      const size_t all = n;
      n = static_cast<size_t>(p.top_k);
      std::nth_element(keys_.begin(), keys_.begin() + n, keys_.begin() + all);
      total = 0.0;
      for (size_t i = 0; i < n; ++i) total += w[KeyId(keys_[i])];
    }
    // min-p drops a canonical suffix and top-p keeps a canonical prefix, so their
    // intersection is the shorter one: filter by min-p first (cheap), then look for the
    // top-p prefix among what is left, against the mass of the whole top-k set.
    double kept = total;
    if (p.min_p > 0.0f) {
      const float threshold = p.min_p;  // times the largest weight, 1
      n = static_cast<size_t>(
          std::partition(keys_.begin(), keys_.begin() + n,
                         [&](uint64_t key) { return w[KeyId(key)] >= threshold; }) -
          keys_.begin());
      kept = 0.0;
      for (size_t i = 0; i < n; ++i) kept += w[KeyId(keys_[i])];
    }
    if (p.top_p < 1.0f) {
      n = SelectPrefix(n, static_cast<double>(p.top_p) * total, /*strict=*/false, &kept);
    }
    // Inverse CDF in canonical order.
    const double u = UniformFromSeedStep(seed, step);
    double unused;
    const size_t j = n == 1 ? 1 : SelectPrefix(n, u * kept, /*strict=*/true, &unused);
    result.token = KeyId(keys_[j - 1]);
  }

  TANDEM_CHECK(std::isfinite(sum_exp) && sum_exp >= 1.0) << "NaN or +inf logits";
  const double log_z = static_cast<double>(max) + std::log(sum_exp);
  result.logprob = static_cast<float>(static_cast<double>(l[result.token]) - log_z);
  if (p.logprobs > 0) {
    const size_t count = std::min(static_cast<size_t>(p.logprobs), vocab);
    result.top_logprobs.reserve(count);
    for (const uint64_t key : TopKeys(l, vocab, count)) {
      const int32_t id = KeyId(key);
      result.top_logprobs.emplace_back(id,
                                       static_cast<float>(static_cast<double>(l[id]) - log_z));
    }
  }
  return result;
}

}  // namespace tandem
