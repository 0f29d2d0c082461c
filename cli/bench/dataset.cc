#include "cli/bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace tandem::cli {
namespace {

int Length(int base, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return base;
  const int lo = std::max(1, static_cast<int>(std::floor(base * (1 - ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(base * (1 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

}  // namespace

absl::Status ValidateDataset(const DatasetOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1 || o.range_ratio < 0 || o.range_ratio >= 1 ||
      o.num_prefixes < 1 || o.prefix_len < 0 || o.num_warmup < 0) {
    return absl::InvalidArgumentError("bench: counts and lengths must be positive, 0 <= range ratio < 1");
  }
  return absl::OkStatus();
}

Dataset MakeDataset(const DatasetOptions& o, int64_t vocab_size, int copies) {
  const int32_t lo = 3, hi = static_cast<int32_t>(std::min<int64_t>(vocab_size, 128000)) - 1;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(lo, std::max(lo, hi));
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(o.prefix_len > 0 ? o.num_prefixes : 0));
  for (auto& p : prefixes) {
    for (int i = 0; i < o.prefix_len; ++i) p.push_back(token(rng));
  }
  Dataset d;
  d.measured.resize(static_cast<size_t>(copies));
  d.warmup.resize(static_cast<size_t>(copies));
  // Prompt i of every copy before prompt i+1 of any: copy 0 draws what it drew alone.
  for (int i = 0; i < o.num_prompts; ++i) {
    for (int c = 0; c < copies; ++c) {
      BenchPrompt p;
      if (!prefixes.empty()) p.token_ids = prefixes[i % prefixes.size()];
      const int n = Length(o.input_len, o.range_ratio, rng);
      for (int k = 0; k < n; ++k) p.token_ids.push_back(token(rng));
      p.seed = o.seed + static_cast<uint64_t>(i);
      p.max_tokens = Length(o.output_len, o.range_ratio, rng);
      d.measured[c].push_back(std::move(p));
    }
  }
  std::mt19937_64 warmup_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < o.num_warmup; ++i) {
    for (int c = 0; c < copies; ++c) {
      BenchPrompt p;
      const int n = o.prefix_len + Length(o.input_len, o.range_ratio, warmup_rng);
      for (int k = 0; k < n; ++k) p.token_ids.push_back(token(warmup_rng));
      p.seed = o.seed + static_cast<uint64_t>(o.num_prompts + i);
      p.max_tokens = Length(o.output_len, o.range_ratio, warmup_rng);
      d.warmup[c].push_back(std::move(p));
    }
  }
  return d;
}

}  // namespace tandem::cli
