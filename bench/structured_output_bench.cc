// What structured output costs the engine: a closed-loop workload (S streams, each keeping
// one request in flight: P prompt tokens, at most T generated) run for D seconds with every
// request under a JSON schema of the corpus, then the same requests' output lengths
// replayed unconstrained, on one model in one process; the ratio of generated tokens per second is the figure (issue 24's goal
// on the H200 with 64 streams: >= 0.95). Schemas are compiled before the constrained
// phase (the compile cache holds them all), so the phase measures masks and sampling, not
// compiles; compile times are reported apart.
//
//   structured_output_bench --model DIR --schemas corpus.json [--device cuda] [--streams 64]
//       [--prompt 128] [--output 128] [--seconds 20] [--json FILE]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Phase {
  double seconds = 0;
  int64_t requests = 0;
  int64_t generated = 0;
  int64_t stopped = 0;  // ended by the grammar's end (EOS), not max_tokens
  int64_t failed = 0;
  double tokens_per_s() const { return seconds > 0 ? generated / seconds : 0; }
};

std::vector<int32_t> Prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>(100 + (i * 131 + salt * 7919) % (vocab - 200));
  return t;
}

// `lengths`: with schemas, filled with each stream's requests' output lengths; without,
// the unconstrained requests replay them (max_tokens, ignore_eos), so that both phases
// run the same mix of prefills and decodes.
Phase RunPhase(Engine& e, const std::vector<std::string>& schemas, int streams, int prompt, int output,
               double seconds, std::vector<std::vector<int>>* lengths) {
  std::atomic<int64_t> requests{0}, generated{0}, stopped{0}, failed{0};
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      for (int k = 0; Clock::now() < end; ++k) {
        EngineRequest r;
        r.id = absl::StrCat(schemas.empty() ? "u" : "c", s, "-", k);
        r.prompt = Prompt(prompt, s * 1000 + k, e.config().vocab_size);
        r.sampling.temperature = 1.0f;
        r.sampling.seed = static_cast<uint64_t>(s * 100000 + k);
        r.stop.max_tokens = output;
        const std::vector<int>& replay = (*lengths)[static_cast<size_t>(s)];
        if (schemas.empty()) {
          r.stop.ignore_eos = true;
          if (!replay.empty()) r.stop.max_tokens = std::max(1, replay[static_cast<size_t>(k) % replay.size()]);
        } else {
          r.constraint = {.kind = OutputConstraint::Kind::kJsonSchema,
                          .text = schemas[static_cast<size_t>(s + k) % schemas.size()]};
        }
        absl::StatusOr<std::shared_ptr<OutputStream>> st = e.Submit(std::move(r));
        if (!st.ok()) {
          failed++;
          continue;
        }
        RequestOutput o;
        int produced = 0;
        while ((*st)->Next(&o)) {
          produced += static_cast<int>(o.token_ids.size());
          // Only what the phase's window produced: the requests still running at its end
          // finish with fewer streams beside them.
          if (Clock::now() <= end) generated += static_cast<int64_t>(o.token_ids.size());
          if (o.finished) {
            if (!o.status.ok()) failed++;
            if (o.finish_reason == FinishReason::kStop) stopped++;
          }
        }
        requests++;
        if (!schemas.empty()) (*lengths)[static_cast<size_t>(s)].push_back(produced);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Phase p;
  p.seconds = seconds;  // the window the tokens were counted in
  p.requests = requests;
  p.generated = generated;
  p.stopped = stopped;
  p.failed = failed;
  return p;
}

nlohmann::json ToJson(const Phase& p) {
  return {{"seconds", p.seconds},     {"requests", p.requests}, {"generated_tokens", p.generated},
          {"ended_by_grammar", p.stopped}, {"failed", p.failed}, {"tokens_per_s", p.tokens_per_s()}};
}

int Run(int argc, char** argv) {
  std::string model, schemas_file, device = "cpu", json;
  int streams = 64, prompt = 128, output = 128, max_schemas = 48;
  double seconds = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") model = next();
    else if (a == "--schemas") schemas_file = next();
    else if (a == "--device") device = next();
    else if (a == "--streams") streams = std::stoi(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--output") output = std::stoi(next());
    else if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--max-schemas") max_schemas = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr,
                   "usage: structured_output_bench --model DIR --schemas corpus.json [--device cpu|cuda] "
                   "[--streams N] [--prompt N] [--output N] [--seconds S] [--max-schemas N] [--json FILE]\n");
      return 2;
    }
  }
  if (model.empty() || schemas_file.empty()) {
    std::fprintf(stderr, "--model DIR and --schemas FILE are required\n");
    return 2;
  }
  std::ifstream f(schemas_file);
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(ss.str(), nullptr, false);
  if (!corpus.is_object() || !corpus.contains("schemas")) {
    std::fprintf(stderr, "%s: not a schema corpus ({\"schemas\": [{\"schema\": ...}]})\n", schemas_file.c_str());
    return 2;
  }
  std::vector<std::string> schemas;
  for (const auto& e : corpus["schemas"]) {
    if (static_cast<int>(schemas.size()) >= max_schemas) break;
    if (e.value("whitespace", "python") != "python") continue;
    schemas.push_back(e["schema"].dump());
  }

  EngineOptions o;
  o.device = device;
  o.max_running = streams;
  o.max_waiting = 4 * streams;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(model, o);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", std::string(e.status().message()).c_str());
    return 1;
  }
  // Compile every schema once (one short request each): the constrained phase then finds
  // them in the cache.
  const auto compile_start = Clock::now();
  std::vector<std::string> usable;
  for (size_t i = 0; i < schemas.size(); ++i) {
    EngineRequest r;
    r.id = absl::StrCat("warm-", i);
    r.prompt = Prompt(8, static_cast<int>(i), (*e)->config().vocab_size);
    r.stop.max_tokens = 1;
    r.constraint = {.kind = OutputConstraint::Kind::kJsonSchema, .text = schemas[i]};
    absl::StatusOr<std::shared_ptr<OutputStream>> st = (*e)->Submit(std::move(r));
    RequestOutput out, last;
    while (st.ok() && (*st)->Next(&out)) last = out;
    if (st.ok() && last.status.ok()) usable.push_back(schemas[i]);
  }
  const double compile_s = std::chrono::duration<double>(Clock::now() - compile_start).count();
  const EngineStats warm = (*e)->Stats();
  std::vector<std::vector<int>> none(static_cast<size_t>(streams)), lengths(static_cast<size_t>(streams));
  (void)RunPhase(**e, {}, streams, prompt, output, std::min(3.0, seconds / 4), &none);  // warm-up
  const Phase constrained = RunPhase(**e, usable, streams, prompt, output, seconds, &lengths);
  const Phase free = RunPhase(**e, {}, streams, prompt, output, seconds, &lengths);
  const EngineStats after = (*e)->Stats();

  nlohmann::json out = {
      {"bench", "structured_output"},
      {"device", (*e)->device_name()},
      {"model", (*e)->config().summary},
      {"streams", streams},
      {"prompt_tokens", prompt},
      {"max_output_tokens", output},
      {"schemas", usable.size()},
      {"schemas_refused", schemas.size() - usable.size()},
      {"warm_compile_seconds_total", compile_s},
      {"warm_compile_seconds_per_schema", usable.empty() ? 0.0 : warm.constraint_compile_seconds / usable.size()},
      {"unconstrained", ToJson(free)},
      {"constrained", ToJson(constrained)},
      {"constrained_tokens", after.constrained_tokens},
      {"engine_thread_mask_fill_seconds", after.constraint_mask_seconds},
      {"engine_thread_accept_seconds", after.constraint_accept_seconds},
      {"engine_steps", after.steps},
      {"constraint_cache_hits", after.constraint_cache_hits},
      {"throughput_ratio", free.tokens_per_s() > 0 ? constrained.tokens_per_s() / free.tokens_per_s() : 0.0},
  };
  std::printf("%s\n", out.dump(1).c_str());
  if (!json.empty()) std::ofstream(json) << out.dump(1) << "\n";
  return free.failed + constrained.failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Run(argc, argv); }
