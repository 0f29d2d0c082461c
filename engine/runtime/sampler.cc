#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/check.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TANDEM_SAMPLER_AVX2 1
#endif

namespace tandem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Weights below e^-87 (relative to the most likely token) are 0: such tokens are no
// candidates. The others are bucketed by -log(weight): about kTargetBuckets over the
// range the candidates span (few enough for the histogram to stay in L1), but no coarser
// than kMinBucketsPerNat; kNumBuckets holds the widest range at that resolution.
constexpr float kExpCutoff = -87.0f;
constexpr float kMinBucketsPerNat = 64.0f;
constexpr float kTargetBuckets = 1024.0f;
constexpr size_t kNumBuckets = 88 * 64;
constexpr uint16_t kNoBucket = 0xFFFF;

// Cephes' expf: exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;

#if TANDEM_SAMPLER_AVX2
// Eight SamplerExp at once, operation for operation the scalar form.
__m256 ExpAvx2(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kExpCutoff), _CMP_GE_OQ);
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kExpP0);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP5));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvtps_epi32(fx);
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(_mm256_mul_ps(y, scale), keep);
}

double HorizontalSum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#endif

// Max and smallest finite value of the logits (NaN makes *has_nan true).
float MinMaxLogit(const float* l, size_t n, float* min_finite, bool* has_nan) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  size_t i = 0;
  float max = kNegInf;
  float min = kInf;
  bool nan = false;
#if TANDEM_SAMPLER_AVX2
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256 pos_inf = _mm256_set1_ps(kInf);
  __m256 vmax = neg_inf;
  __m256 vmin = pos_inf;
  __m256 vnan = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(l + i);
    vmax = _mm256_max_ps(vmax, v);
    vmin = _mm256_min_ps(vmin, _mm256_blendv_ps(v, pos_inf, _mm256_cmp_ps(v, neg_inf, _CMP_EQ_OQ)));
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (const float x : lanes) max = std::max(max, x);
  _mm256_store_ps(lanes, vmin);
  for (const float x : lanes) min = std::min(min, x);
  nan = _mm256_movemask_ps(vnan) != 0;
#endif
  for (; i < n; ++i) {
    nan |= std::isnan(l[i]);
    if (l[i] > max) max = l[i];
    if (l[i] < min && l[i] != kNegInf) min = l[i];
  }
  *has_nan = nan;
  *min_finite = min;
  return max;
}

// The first index whose logit equals v (present).
size_t FirstIndexOf(const float* l, size_t n, float v) {
  size_t i = 0;
#if TANDEM_SAMPLER_AVX2
  const __m256 target = _mm256_set1_ps(v);
  for (; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), target, _CMP_EQ_OQ));
    if (mask != 0) return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask)));
  }
#endif
  for (; i < n; ++i) {
    if (l[i] == v) return i;
  }
  TANDEM_CHECK(false) << "max logit not found";
  return 0;
}

// sum_i SamplerExp((l[i] - max) * inv_t), in double; the terms go to w when not null.
double ExpWeights(const float* l, size_t n, float max, float inv_t, float* w) {
  size_t i = 0;
  double sum = 0.0;
#if TANDEM_SAMPLER_AVX2
  const __m256 vmax = _mm256_set1_ps(max);
  const __m256 vinv = _mm256_set1_ps(inv_t);
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = ExpAvx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(l + i), vmax), vinv));
    if (w != nullptr) _mm256_storeu_ps(w + i, e);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  sum = HorizontalSum(_mm256_add_pd(acc0, acc1));
#endif
  for (; i < n; ++i) {
    const float e = SamplerExp((l[i] - max) * inv_t);
    if (w != nullptr) w[i] = e;
    sum += e;
  }
  return sum;
}

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

// The `count` smallest canonical keys of all logits, sorted: a bounded max-heap whose
// common case is one float comparison (ids come in ascending order, so a token that
// ties the worst kept logit never enters).
std::vector<uint64_t> TopKeys(const float* logits, size_t vocab, size_t count) {
  std::vector<uint64_t> heap;
  heap.reserve(count);
  float worst = kNegInf;
  for (size_t i = 0; i < vocab; ++i) {
    if (heap.size() == count && !(logits[i] > worst)) continue;
    const uint64_t key = CanonicalKey(logits[i], i);
    if (heap.size() < count) {
      heap.push_back(key);
      std::push_heap(heap.begin(), heap.end());
    } else {
      std::pop_heap(heap.begin(), heap.end());
      heap.back() = key;
      std::push_heap(heap.begin(), heap.end());
    }
    if (heap.size() == count) worst = logits[KeyId(heap.front())];
  }
  std::sort(heap.begin(), heap.end());
  return heap;
}

// The max of a logits row, checking the contract of Sample, Verify and GreedyDraft.
float CheckedMaxLogit(const float* l, size_t vocab, float* min_finite) {
  TANDEM_CHECK(vocab > 0 && vocab < static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      << vocab;
  bool has_nan = false;
  const float max = MinMaxLogit(l, vocab, min_finite, &has_nan);
  TANDEM_CHECK(!has_nan) << "NaN logits";
  TANDEM_CHECK(std::isfinite(max)) << "no finite logit, or +inf (max " << max << ")";
  return max;
}

// `token` with its log-probability and the top `logprobs` under the penalized
// log_softmax (step 2 in sampler.h).
SampledToken WithLogprobs(const float* l, size_t vocab, int32_t token, double log_z,
                          int32_t logprobs) {
  SampledToken result;
  result.token = token;
  result.logprob = static_cast<float>(static_cast<double>(l[token]) - log_z);
  if (logprobs > 0) {
    const size_t count = std::min(static_cast<size_t>(logprobs), vocab);
    result.top_logprobs.reserve(count);
    for (const uint64_t key : TopKeys(l, vocab, count)) {
      const int32_t id = KeyId(key);
      result.top_logprobs.emplace_back(id,
                                       static_cast<float>(static_cast<double>(l[id]) - log_z));
    }
  }
  return result;
}

}  // namespace

float SamplerExp(float x) {
  // Fused where the vector form is (std::fma without hardware FMA is a slow library call,
  // and there is no vector form to match then).
#if defined(__FMA__)
  const auto fma = [](float a, float b, float c) { return std::fma(a, b, c); };
#else
  const auto fma = [](float a, float b, float c) { return a * b + c; };
#endif
  if (!(x >= kExpCutoff)) return 0.0f;
  const float fx = std::nearbyint(x * kLog2e);
  float r = fma(fx, -kLn2Hi, x);
  r = fma(fx, -kLn2Lo, r);
  float y = kExpP0;
  y = fma(y, r, kExpP1);
  y = fma(y, r, kExpP2);
  y = fma(y, r, kExpP3);
  y = fma(y, r, kExpP4);
  y = fma(y, r, kExpP5);
  y = fma(y, r * r, r);
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

double UniformFromSeedStep(uint64_t seed, int64_t step) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;  // SplitMix64's increment
  const uint64_t h = Mix64(Mix64(seed + kGamma) ^ (static_cast<uint64_t>(step) + kGamma));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

double UniformFromSeedStream(uint64_t seed, int64_t step, SeedStream stream) {
  // The step is tagged with Mix64(stream): Mix64(0) == 0, so kSample is
  // UniformFromSeedStep itself; the tags of the streams differ pairwise in their high 32
  // bits, so for steps in [0, 2^32) the tagged steps of one seed are all distinct, and
  // UniformFromSeedStep is a bijection of the step for a seed (before dropping 11 bits).
  const uint64_t tag = Mix64(static_cast<uint64_t>(stream));
  return UniformFromSeedStep(seed, static_cast<int64_t>(static_cast<uint64_t>(step) ^ tag));
}

DraftChoice GreedyDraft(std::span<const float> logits) {
  const float* l = logits.data();
  const size_t vocab = logits.size();
  float min_finite = 0.0f;
  const float max = CheckedMaxLogit(l, vocab, &min_finite);
  DraftChoice choice;
  choice.token = static_cast<int32_t>(FirstIndexOf(l, vocab, max));
  // The argmax's own term is exp(0) = 1.
  choice.confidence = static_cast<float>(1.0 / ExpWeights(l, vocab, max, 1.0f, nullptr));
  return choice;
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
  for (const auto& [id, bias] : p.logit_bias) {
    CheckTokenId(id, vocab);
    logits[id] += bias;
  }
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

void Sampler::BuildHistogram(const float* l, size_t vocab, float max, float min_finite,
                             float inv_t, float min_p) {
  weights_.resize(vocab);
  bucket_.resize(vocab);
  keys_.resize(vocab);
  bucket_count_.assign(kNumBuckets, 0);
  bucket_mass_.assign(kNumBuckets, 0.0);
  total_mass_ = ExpWeights(l, vocab, max, inv_t, weights_.data());
  // -log(weight) times buckets per nat, computed from the logit so that buckets follow
  // the canonical order.
  const float range = std::min((max - min_finite) * inv_t, -kExpCutoff);
  float scale = inv_t * std::max(kMinBucketsPerNat, kTargetBuckets / range);
  if (!(range > 0.0f) || !std::isfinite(scale)) scale = inv_t * kMinBucketsPerNat;
  constexpr float kLastBucket = static_cast<float>(kNumBuckets - 1);
  const float* w = weights_.data();
  size_t candidates = 0;
  size_t min_p_count = 0;
  double min_p_mass = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    if (!(w[i] > 0.0f)) {
      bucket_[i] = kNoBucket;
      continue;
    }
    const size_t b = static_cast<size_t>(std::min((max - l[i]) * scale, kLastBucket));
    bucket_[i] = static_cast<uint16_t>(b);
    ++bucket_count_[b];
    bucket_mass_[b] += w[i];
    ++candidates;
    if (w[i] >= min_p) {
      ++min_p_count;
      min_p_mass += w[i];
    }
  }
  num_candidates_ = candidates;
  min_p_count_ = min_p_count;
  min_p_mass_ = min_p_mass;
}

Sampler::Cut Sampler::Locate(size_t length) const {
  TANDEM_CHECK(length >= 1 && length <= num_candidates_) << length;
  size_t before = 0;
  for (size_t b = 0; b < kNumBuckets; ++b) {
    if (before + bucket_count_[b] >= length) return Cut{b, length - before};
    before += bucket_count_[b];
  }
  TANDEM_CHECK(false) << "histogram holds fewer than " << length << " candidates";
  return Cut{};
}

bool Sampler::CollectBucket(const float* l, Cut cut) {
  const size_t vocab = bucket_.size();
  const uint16_t* bucket = bucket_.data();
  const uint16_t target = static_cast<uint16_t>(cut.bucket);
  uint64_t* keys = keys_.data();
  size_t m = 0;
  size_t i = 0;
  bool sorted = true;  // typical when the bucket's logits are all equal
#if TANDEM_SAMPLER_AVX2
  const __m256i vtarget = _mm256_set1_epi16(static_cast<int16_t>(target));
  for (; i + 16 <= vocab; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bucket + i));
    uint32_t mask = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(v, vtarget)));
    while (mask != 0) {  // two mask bits per match
      const size_t j = i + static_cast<size_t>(__builtin_ctz(mask)) / 2;
      const uint64_t key = CanonicalKey(l[j], j);
      sorted &= m == 0 || key > keys[m - 1];
      keys[m++] = key;
      mask &= mask - 1;
      mask &= mask - 1;
    }
  }
#endif
  for (; i < vocab; ++i) {
    if (bucket[i] != target) continue;
    const uint64_t key = CanonicalKey(l[i], i);
    sorted &= m == 0 || key > keys[m - 1];
    keys[m++] = key;
  }
  TANDEM_CHECK_EQ(m, static_cast<size_t>(bucket_count_[cut.bucket]));
  if (!sorted && cut.in_bucket < m) std::nth_element(keys, keys + cut.in_bucket, keys + m);
  return sorted;
}

double Sampler::PrefixMass(const float* l, size_t length) {
  const Cut cut = Locate(length);
  double mass = 0.0;
  for (size_t b = 0; b < cut.bucket; ++b) mass += bucket_mass_[b];
  if (cut.in_bucket == bucket_count_[cut.bucket]) return mass + bucket_mass_[cut.bucket];
  CollectBucket(l, cut);
  for (size_t i = 0; i < cut.in_bucket; ++i) mass += weights_[KeyId(keys_[i])];
  return mass;
}

Sampler::Selection Sampler::SelectByMass(const float* l, double target, bool strict,
                                         size_t limit) {
  const Cut end = Locate(limit);
  double acc = 0.0;
  size_t before = 0;
  for (size_t b = 0; b <= end.bucket; ++b) {
    const bool last = b == end.bucket;
    if (!last) {
      const double m = acc + bucket_mass_[b];
      if (bucket_count_[b] == 0 || !(strict ? m > target : m >= target)) {
        acc = m;
        before += bucket_count_[b];
        continue;
      }
    }
    // The boundary lies in bucket b (or rounding kept every earlier prefix short).
    const Cut cut{b, last ? end.in_bucket : bucket_count_[b]};
    const bool sorted = CollectBucket(l, cut);
    Selection selection;
    const size_t k = SelectPrefix(cut.in_bucket, target, strict, sorted, acc, &selection.mass);
    selection.length = before + k;
    selection.last = KeyId(keys_[k - 1]);
    return selection;
  }
  TANDEM_CHECK(false) << "unreachable";
  return Selection{};
}

size_t Sampler::SelectPrefix(size_t n, double target, bool strict, bool sorted, double acc,
                             double* mass) {
  // Invariant: keys[0, lo) are the lo first candidates and, with acc, weigh less than
  // the target; keys[lo, hi) are the next ones (unordered); the answer lies in (lo, hi].
  // The first probe is small (most of the mass is usually on few tokens); after it,
  // bisection, so the total work is O(n).
  constexpr size_t kSortBelow = 128;
  constexpr size_t kFirstProbe = 256;
  uint64_t* keys = keys_.data();
  const float* w = weights_.data();
  const auto reaches = [&](double m) { return strict ? m > target : m >= target; };
  size_t lo = 0;
  size_t hi = n;
  size_t probe = kFirstProbe;
  while (!sorted && hi - lo > kSortBelow) {
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
  if (!sorted) std::sort(keys + lo, keys + hi);
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

Sampler::Target Sampler::Prepare(std::span<float> logits, const SamplingParams& p,
                                 std::span<const int32_t> prompt_tokens,
                                 std::span<const int32_t> output_tokens) {
  const size_t vocab = logits.size();
  ApplyPenalties(logits, p, prompt_tokens, output_tokens);
  const float* l = logits.data();
  float min_finite = 0.0f;
  const float max = CheckedMaxLogit(l, vocab, &min_finite);

  Target target;
  double sum_exp = 0.0;  // sum exp(l - max), for the log-softmax
  if (p.temperature < kGreedyTemperature) {
    target.argmax = static_cast<int32_t>(FirstIndexOf(l, vocab, max));
    sum_exp = ExpWeights(l, vocab, max, 1.0f, nullptr);
  } else {
    const float inv_t = 1.0f / p.temperature;
    BuildHistogram(l, vocab, max, min_finite, inv_t, p.min_p);
    sum_exp = inv_t == 1.0f ? total_mass_ : ExpWeights(l, vocab, max, 1.0f, nullptr);
    // Each step keeps a canonical prefix of what the previous one kept, so the kept set
    // is always the first n candidates, weighing `kept`.
    size_t n = num_candidates_;
    double top_k_mass = total_mass_;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
      n = static_cast<size_t>(p.top_k);
      top_k_mass = PrefixMass(l, n);
    }
    double kept = top_k_mass;
    // min-p drops a canonical suffix and top-p keeps a prefix, so applying min-p first
    // and then top-p within it (against the top-k mass) keeps the same tokens.
    if (p.min_p > 0.0f && min_p_count_ < n) {
      n = min_p_count_;
      kept = min_p_mass_;
    }
    if (p.top_p < 1.0f) {
      const Selection s =
          SelectByMass(l, static_cast<double>(p.top_p) * top_k_mass, /*strict=*/false, n);
      n = s.length;
      kept = s.mass;
    }
    target.kept = n;
    target.kept_mass = kept;
  }
  target.log_z = static_cast<double>(max) + std::log(sum_exp);
  return target;
}

SampledToken Sampler::Sample(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                             int64_t step, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens) {
  const Target target = Prepare(logits, p, prompt_tokens, output_tokens);
  const float* l = logits.data();
  int32_t token = target.argmax;
  if (p.temperature >= kGreedyTemperature) {
    // Inverse CDF in canonical order.
    const double u = UniformFromSeedStep(seed, step);
    token = SelectByMass(l, u * target.kept_mass, /*strict=*/true, target.kept).last;
  }
  return WithLogprobs(l, logits.size(), token, target.log_z, p.logprobs);
}

VerifiedToken Sampler::Verify(std::span<float> logits, const SamplingParams& p, uint64_t seed,
                              int64_t step, std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> output_tokens, int32_t draft) {
  TANDEM_CHECK(draft >= 0 && static_cast<size_t>(draft) < logits.size())
      << "draft " << draft << " outside the vocabulary of " << logits.size();
  const Target target = Prepare(logits, p, prompt_tokens, output_tokens);
  const float* l = logits.data();
  const int32_t token = p.temperature < kGreedyTemperature
                            ? target.argmax
                            : VerifySampled(l, target, seed, step, draft);
  VerifiedToken result;
  result.sampled = WithLogprobs(l, logits.size(), token, target.log_z, p.logprobs);
  result.accepted = token == draft;
  return result;
}

int32_t Sampler::VerifySampled(const float* l, const Target& target, uint64_t seed,
                               int64_t step, int32_t draft) {
  const size_t vocab = weights_.size();
  float* w = weights_.data();
  // The kept set is a canonical prefix of the candidates: those of positive weight that
  // rank at or before the last kept one (every candidate when nothing was truncated).
  // Non-candidates weigh 0, so the weight alone keeps them out of every sum below.
  float last_logit = kNegInf;
  size_t last_id = vocab;
  if (target.kept < num_candidates_) {
    last_id = static_cast<size_t>(KeyId(NthKey(l, target.kept)));
    last_logit = l[last_id];
  }
  // Branch-free (a product, not a select, which compilers turn into a branch): membership
  // by id looks random, and branching on it mispredicts.
  const auto kept_weight = [&](size_t i) {
    const bool kept = (l[i] > last_logit) | ((l[i] == last_logit) & (i <= last_id));
    return w[i] * static_cast<float>(kept);
  };
  // Accepted with probability p(draft) = w / kept_mass, compared as Sample compares u * mass.
  const double draft_weight = kept_weight(static_cast<size_t>(draft));
  if (UniformFromSeedStream(seed, step, SeedStream::kDraftAccept) * target.kept_mass <
      draft_weight) {
    return draft;
  }
  // Refused: p without the draft, whose weight (scratch, not read again in this call) is
  // now 0. Its mass is summed rather than taken as kept_mass - w[draft] (which cancels
  // when p(draft) is near 1), per block of ids (four accumulators, so the adds do not
  // wait on each other), so that the draw can find its block from the block sums and scan
  // just that one.
  w[draft] = 0.0f;
  constexpr size_t kBlock = 256;
  const size_t blocks = (vocab + kBlock - 1) / kBlock;
  block_mass_.resize(blocks);
  double rest = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t end = std::min(vocab, (b + 1) * kBlock);
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = b * kBlock;
    for (; i + 4 <= end; i += 4) {
      s0 += kept_weight(i);
      s1 += kept_weight(i + 1);
      s2 += kept_weight(i + 2);
      s3 += kept_weight(i + 3);
    }
    for (; i < end; ++i) s0 += kept_weight(i);
    block_mass_[b] = (s0 + s1) + (s2 + s3);
    rest += block_mass_[b];
  }
  if (!(rest > 0.0)) return draft;  // rounding: nothing else to draw
  // Inverse CDF in id order. The running sum over blocks repeats rest's additions, so it
  // ends exactly at rest, above the threshold (u < 1): some block holds the draw.
  const double threshold = UniformFromSeedStream(seed, step, SeedStream::kDraftRedraw) * rest;
  double acc = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    if (!(acc + block_mass_[b] > threshold)) {
      acc += block_mass_[b];
      continue;
    }
    const size_t end = std::min(vocab, (b + 1) * kBlock);
    int32_t last_positive = -1;  // exists: the block weighs more than threshold - acc >= 0
    for (size_t i = b * kBlock; i < end; ++i) {
      const float x = kept_weight(i);
      if (!(x > 0.0f)) continue;
      acc += x;
      last_positive = static_cast<int32_t>(i);
      if (acc > threshold) return last_positive;
    }
    return last_positive;  // rounding: the scan summed the block a little short
  }
  TANDEM_CHECK(false) << "redraw past the kept mass";
  return draft;
}

uint64_t Sampler::NthKey(const float* l, size_t n) {
  const Cut cut = Locate(n);
  // keys_[0, in_bucket) are then the bucket's first in_bucket members, in some order.
  CollectBucket(l, cut);
  return *std::max_element(keys_.begin(), keys_.begin() + static_cast<ptrdiff_t>(cut.in_bucket));
}

}  // namespace tandem
