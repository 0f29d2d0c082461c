// The benchmark's dataset: random token prompts, optionally starting with one of a few
// shared prefixes, as `vllm bench serve --dataset-name random` makes them, and warm-up
// prompts that share nothing with the measured ones.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cli/bench/bench_backend.h"

namespace tandem::cli {

struct DatasetOptions {
  int num_prompts = 1000;
  int input_len = 512;
  int output_len = 128;
  double range_ratio = 0;  // lengths uniform in [len*(1-r), len*(1+r)]
  int prefix_len = 0;      // shared-prefix dataset: each prompt = prefix + random part
  int num_prefixes = 1;
  uint64_t seed = 0;
  int num_warmup = 1;
};

// INVALID_ARGUMENT for counts or lengths out of range.
absl::Status ValidateDataset(const DatasetOptions& options);

struct Dataset {
  // measured[c][i]: prompt i of copy c. Copies have the same shape (prompt i of every copy
  // starts with the same shared prefix and asks for the same output length range) and
  // distinct random tokens: one copy per backend when backends are compared, so that no
  // backend finds another's prompt in a cache.
  std::vector<std::vector<BenchPrompt>> measured;
  // Warm-up prompts, num_warmup per copy, from a generator of their own and without the
  // shared prefixes: no measured request is a cache hit on a warm-up.
  std::vector<std::vector<BenchPrompt>> warmup;
};

// Token ids are drawn from [3, min(vocab_size, 128000)): DeepSeek's special tokens sit at
// both ends of its vocabulary. Copy 0 is the same whatever `copies` is.
Dataset MakeDataset(const DatasetOptions& options, int64_t vocab_size, int copies);

}  // namespace tandem::cli
