// Host sampling over DeepSeek-V3's vocabulary, per case, against the cheapest pass a
// sampler must make over the logits (one argmax over the same row, same run): a sampler
// that sorts the whole vocabulary or copies it more than it must shows as a large ratio.
// Prints JSON; not a test (absolute timings on shared machines are noisy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<float> RandomLogits(size_t vocab, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(rng);
  return logits;
}

double MedianMs(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Main() {
  constexpr size_t kVocab = 129280;
  constexpr int kReps = 50;
  SamplingParams top_p;
  top_p.top_p = 0.9f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams full;
  SamplingParams typical;
  typical.temperature = 0.7f;
  typical.top_p = 0.95f;
  typical.top_k = 50;
  typical.repetition_penalty = 1.1f;
  typical.logprobs = 5;
  SamplingParams hot = top_p;
  hot.temperature = 100.0f;
  struct Case {
    const char* name;
    float stddev;
    SamplingParams params;
  };
  const Case cases[] = {{"top_p 0.9, flat logits (N(0,1))", 1.0f, top_p},
                        {"top_p 0.9, all logits equal", 0.0f, top_p},
                        {"top_p 0.9, T=100", 1.0f, hot},
                        {"top_p 0.9, peaked logits (N(0,4))", 4.0f, top_p},
                        {"greedy", 1.0f, greedy},
                        {"no truncation, T=1", 1.0f, full},
                        {"T 0.7 top_k 50 top_p 0.95 rep 1.1 logprobs 5", 2.0f, typical}};
  const std::vector<int32_t> prompt(2000, 17);
  const std::vector<int32_t> output(500, 23);
  Sampler sampler;
  nlohmann::json out = {{"benchmark", "sampler"}, {"vocab", kVocab}, {"reps", kReps}};
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& c : cases) {
    const std::vector<float> logits = RandomLogits(kVocab, c.stddev, 41);
    std::vector<float> scratch(kVocab);
    std::vector<double> sample_ms, argmax_ms;
    volatile size_t sink = 0;
    for (int step = 0; step < kReps; ++step) {
      std::copy(logits.begin(), logits.end(), scratch.begin());
      auto start = Clock::now();
      sink = sink + static_cast<size_t>(std::max_element(scratch.begin(), scratch.end()) - scratch.begin());
      argmax_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      std::copy(logits.begin(), logits.end(), scratch.begin());
      start = Clock::now();
      sampler.Sample(scratch, c.params, 3, step, prompt, output);
      sample_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    const double sample = MedianMs(sample_ms);
    const double argmax = MedianMs(argmax_ms);
    rows.push_back({{"case", c.name},
                    {"sample_median_ms", sample},
                    {"argmax_median_ms", argmax},
                    {"sample_over_argmax", argmax > 0 ? sample / argmax : 0.0}});
  }
  out["cases"] = rows;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main() { return tandem::Main(); }
