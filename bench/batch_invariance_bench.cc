// What --batch-invariant costs and whether it holds, on one model in one process: for the
// default engine and then the batch-invariant one (loaded one after the other),
//   1. a seeded target request with 5 top log-probabilities per token run alone, then
//      among C random companions under two step budgets (prefill chunked differently):
//      how many of those runs give the lone run's bits exactly;
//   2. a closed loop of S streams (P prompt tokens, T generated, seeded sampling, tokens
//      chosen on the device) for D seconds: generated tokens per second.
// The figure is the invariant/default throughput ratio (issue 24's goal at 64 streams on
// the H200: a cost of at most 15 %).
//
//   batch_invariance_bench --model DIR [--device cuda] [--streams 64] [--prompt 128]
//       [--output 128] [--seconds 20] [--companions 63] [--json FILE]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> Prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>(100 + (i * 131 + salt * 7919 + (i * i) % 17) % (vocab - 200));
  return t;
}

// Tokens and log-probabilities (chosen and top) of one request, as raw bits.
std::vector<uint32_t> Run(Engine& e, EngineRequest r) {
  std::vector<uint32_t> bits;
  absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
  if (!s.ok()) return bits;
  RequestOutput o;
  auto put = [&](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits.push_back(u);
  };
  while ((*s)->Next(&o)) {
    for (const TokenLogprobs& lp : o.logprobs) {
      bits.push_back(static_cast<uint32_t>(lp.token));
      put(lp.logprob);
      for (const auto& [id, v] : lp.top) {
        bits.push_back(static_cast<uint32_t>(id));
        put(v);
      }
    }
    if (o.finished && !o.status.ok()) return {};
  }
  return bits;
}

EngineRequest Target(int64_t vocab) {
  EngineRequest r;
  r.id = "target";
  r.prompt = Prompt(300, 77, vocab);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 4242;
  r.sampling.logprobs = 5;
  r.stop.max_tokens = 32;
  r.stop.ignore_eos = true;
  return r;
}

// The target among `companions` random requests (random prompt lengths and sampling).
std::vector<uint32_t> RunAmong(Engine& e, int companions, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t vocab = e.config().vocab_size;
  std::vector<std::thread> others;
  for (int i = 0; i < companions; ++i) {
    EngineRequest r;
    r.id = absl::StrCat("c", seed, "-", i);
    r.prompt = Prompt(1 + static_cast<int>(rng() % 600), 1000 + i, vocab);
    r.sampling.temperature = rng() % 3 == 0 ? 0.0f : 0.7f;
    r.sampling.seed = rng();
    r.stop.max_tokens = 1 + static_cast<int>(rng() % 64);
    r.stop.ignore_eos = true;
    others.emplace_back([&e, r]() mutable { (void)Run(e, std::move(r)); });
  }
  std::vector<uint32_t> bits = Run(e, Target(vocab));
  for (auto& t : others) t.join();
  return bits;
}

double Throughput(Engine& e, int streams, int prompt, int output, double seconds, int64_t* generated_out) {
  std::atomic<int64_t> generated{0};
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      for (int k = 0; Clock::now() < end; ++k) {
        EngineRequest r;
        r.id = absl::StrCat("t", s, "-", k);
        r.prompt = Prompt(prompt, s * 1000 + k, e.config().vocab_size);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = static_cast<uint64_t>(s * 100000 + k);
        r.stop.max_tokens = output;
        r.stop.ignore_eos = true;
        absl::StatusOr<std::shared_ptr<OutputStream>> st = e.Submit(std::move(r));
        if (!st.ok()) continue;
        RequestOutput o;
        while ((*st)->Next(&o)) {
          if (Clock::now() <= end) generated += static_cast<int64_t>(o.token_ids.size());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  *generated_out = generated;
  return generated / seconds;
}

int Main(int argc, char** argv) {
  std::string model, device = "cuda", json;
  int streams = 64, prompt = 128, output = 128, companions = 63;
  double seconds = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") model = next();
    else if (a == "--device") device = next();
    else if (a == "--streams") streams = std::stoi(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--output") output = std::stoi(next());
    else if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--companions") companions = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr,
                   "usage: batch_invariance_bench --model DIR [--device cpu|cuda] [--streams N] [--prompt N] "
                   "[--output N] [--seconds S] [--companions N] [--json FILE]\n");
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return 2;
  }
  nlohmann::json out = {{"bench", "batch_invariance"}, {"streams", streams},         {"prompt_tokens", prompt},
                        {"output_tokens", output},     {"companions", companions}, {"seconds", seconds}};
  double tps[2] = {0, 0};
  for (const bool invariant : {false, true}) {
    EngineOptions o;
    o.device = device;
    o.batch_invariant = invariant;
    o.max_running = std::max(streams, companions + 1);
    o.max_waiting = 4 * o.max_running;
    o.gpu_memory_utilization = 0.8;
    const auto t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(model, o);
    if (!e.ok()) {
      std::fprintf(stderr, "%s\n", std::string(e.status().message()).c_str());
      return 1;
    }
    const char* name = invariant ? "batch_invariant" : "default";
    std::fprintf(stderr, "%s: loaded %s in %.1f s\n", name, (*e)->config().summary.c_str(),
                 std::chrono::duration<double>(Clock::now() - t0).count());
    (void)RunAmong(**e, 8, 1);  // warm-up (graphs, allocations)
    const std::vector<uint32_t> alone = RunAmong(**e, 0, 2);
    int equal = 0, runs = 0;
    for (int rep = 0; rep < 4; ++rep) {
      ++runs;
      equal += RunAmong(**e, companions, 10 + rep) == alone && !alone.empty();
    }
    int64_t generated = 0;
    (void)Throughput(**e, streams, prompt, output, std::min(3.0, seconds / 4), &generated);  // warm-up
    tps[invariant] = Throughput(**e, streams, prompt, output, seconds, &generated);
    out[name] = {{"device", (*e)->device_name()},
                 {"model", (*e)->config().summary},
                 {"target_runs_among_companions", runs},
                 {"target_runs_bitwise_equal_to_alone", equal},
                 {"generated_tokens", generated},
                 {"tokens_per_s", tps[invariant]}};
    std::fprintf(stderr, "%s: %d/%d runs among %d companions bitwise equal to the lone run; %.0f tokens/s\n", name,
                 equal, runs, companions, tps[invariant]);
  }
  out["invariant_over_default_throughput"] = tps[0] > 0 ? tps[1] / tps[0] : 0.0;
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!json.empty()) std::ofstream(json) << text << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
