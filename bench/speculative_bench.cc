// What speculative decoding with the MTP layer gains (issue 25), in one process: a
// make-model --mtp-acceptance checkpoint of `--config`'s shapes (on a GPU its weights are
// generated at load: only config.json and the tokenizer are written; on the CPU they are
// written, bf16) at each acceptance P, the
// engine without drafts and then with --drafts N, each over closed batches of B greedy
// requests (--prompt tokens in, --output out): generated tokens per second, the speedup
// against the engine without drafts measured in the same run, and the acceptance the
// drafting engine counted (per position, and the mean accepted length). JSON on stdout.
//
//   speculative_bench --config bench/configs/deepseek_v2_lite_mtp.json [--device cuda]
//       [--acceptance 0.6,0.75,0.9] [--batches 1,16,64] [--drafts 3] [--prompt 64]
//       [--output 256] [--min-confidence 0] [--seed 1] [--adaptive] [--json FILE]
// (--adaptive: the engine's draft policy decides when drafting pays; default: every step drafts)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/model/model_generator.h"
#include "engine/runtime/engine.h"
#include "engine/util/mapped_file.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

struct Args {
  std::string config, device = "cuda", json;
  std::vector<double> acceptance = {0.6, 0.75, 0.9};
  std::vector<int> batches = {1, 16, 64};
  int drafts = 3, prompt = 64, output = 256;
  float min_confidence = 0.0f;
  uint64_t seed = 1;
  bool adaptive = false;  // --adaptive: the engine's policy decides when to draft (default: always)
};

std::vector<int32_t> Prompt(int n, int salt, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>(100 + (i * 131 + salt * 7919 + (i * i) % 17) % (vocab - 200));
  return t;
}

// B greedy requests at once; generated tokens per second over the wall time.
absl::StatusOr<double> RunBatch(Engine& e, const Args& a, int batch, int salt) {
  const int64_t vocab = e.config().vocab_size;
  std::vector<std::shared_ptr<OutputStream>> streams;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < batch; ++i) {
    EngineRequest r;
    r.id = absl::StrCat("b", salt, "-", i);
    r.prompt = Prompt(a.prompt, salt * 1000 + i, vocab);
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = a.output;
    r.stop.ignore_eos = true;
    absl::StatusOr<std::shared_ptr<OutputStream>> s = e.Submit(std::move(r));
    if (!s.ok()) return s.status();
    streams.push_back(*s);
  }
  int64_t tokens = 0;
  for (auto& s : streams) {
    RequestOutput o;
    while (s->Next(&o)) {
      tokens += static_cast<int64_t>(o.token_ids.size());
      if (o.finished && !o.status.ok()) return o.status;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(tokens) / seconds;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const std::string& dir, const Args& a, int drafts) {
  EngineOptions o;
  o.device = a.device;
  o.speculative_tokens = drafts;
  o.speculative_min_confidence = a.min_confidence;
  o.speculative_adaptive = a.adaptive;
  int max_batch = 1;
  for (int b : a.batches) max_batch = std::max(max_batch, b);
  o.max_running = max_batch;
  o.gpu_memory_utilization = 0.85;
  return Engine::Create(dir, o);
}

Json Acceptance(const EngineStats& before, const EngineStats& after) {
  Json j;
  int64_t steps = 0, accepted = 0;
  for (size_t n = 0; n < after.spec_accepted_length.size(); ++n) {
    const int64_t d = after.spec_accepted_length[n] - (n < before.spec_accepted_length.size() ? before.spec_accepted_length[n] : 0);
    steps += d;
    accepted += static_cast<int64_t>(n) * d;
  }
  Json per_position = Json::array();
  int64_t previous = steps;
  for (size_t p = 0; p < after.spec_accepted_by_position.size(); ++p) {
    const int64_t d = after.spec_accepted_by_position[p] -
                      (p < before.spec_accepted_by_position.size() ? before.spec_accepted_by_position[p] : 0);
    per_position.push_back(previous > 0 ? static_cast<double>(d) / previous : 0.0);  // given the ones before
    previous = d;
  }
  const int64_t drafted = after.spec_draft_tokens - before.spec_draft_tokens;
  j["verify_steps"] = steps;
  j["drafted"] = drafted;
  j["accepted"] = accepted;
  j["acceptance_rate"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0;
  j["mean_accepted_per_step"] = steps > 0 ? static_cast<double>(accepted) / steps : 0.0;
  j["accepted_given_previous_by_position"] = per_position;
  return j;
}

int Main(const Args& a) {
  absl::StatusOr<std::string> config = ReadFileToString(a.config);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  Json out;
  out["bench"] = "speculative_bench";
  out["config"] = a.config;
  out["device"] = a.device;
  out["drafts"] = a.drafts;
  out["prompt_tokens"] = a.prompt;
  out["output_tokens"] = a.output;
  out["min_confidence"] = a.min_confidence;
  out["adaptive_policy"] = a.adaptive;
  std::vector<std::string> dirs;
  for (double p : a.acceptance) {
    ModelGeneratorOptions g;
    g.config_json = *config;
    g.seed = a.seed;
    g.write_weights = a.device == "cpu";  // on a GPU: generated at load, the construction included
    g.mtp_acceptance = p;
    const std::string dir = absl::StrCat("/tmp/speculative-bench-", static_cast<int>(p * 1000));
    absl::StatusOr<GeneratedModel> m = GenerateModel(g, dir);
    if (!m.ok()) {
      std::fprintf(stderr, "make-model: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    dirs.push_back(dir);
  }
  // Without drafts: the main model is the same for every P (only the MTP layer's
  // embedding differs), so one baseline serves them all.
  std::vector<double> baseline;
  {
    absl::StatusOr<std::unique_ptr<Engine>> e = MakeEngine(dirs[0], a, 0);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
      return 1;
    }
    out["model"] = (*e)->config().summary;
    out["device_name"] = (*e)->device_name();
    (void)RunBatch(**e, a, 1, 99);  // warm-up
    for (int b : a.batches) {
      absl::StatusOr<double> t = RunBatch(**e, a, b, b);
      if (!t.ok()) {
        std::fprintf(stderr, "baseline batch %d: %s\n", b, std::string(t.status().message()).c_str());
        return 1;
      }
      baseline.push_back(*t);
      std::fprintf(stderr, "no drafts, batch %d: %.1f tokens/s\n", b, *t);
    }
  }
  Json runs = Json::array();
  for (size_t k = 0; k < dirs.size(); ++k) {
    absl::StatusOr<std::unique_ptr<Engine>> e = MakeEngine(dirs[k], a, a.drafts);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
      return 1;
    }
    (void)RunBatch(**e, a, 1, 99);
    for (size_t i = 0; i < a.batches.size(); ++i) {
      const int b = a.batches[i];
      const EngineStats before = (*e)->Stats();
      absl::StatusOr<double> t = RunBatch(**e, a, b, b);
      if (!t.ok()) {
        std::fprintf(stderr, "P %.2f batch %d: %s\n", a.acceptance[k], b, std::string(t.status().message()).c_str());
        return 1;
      }
      Json r;
      r["construction_acceptance"] = a.acceptance[k];
      r["batch"] = b;
      r["tokens_per_second_no_drafts"] = baseline[i];
      r["tokens_per_second_drafts"] = *t;
      r["speedup"] = *t / baseline[i];
      r["acceptance"] = Acceptance(before, (*e)->Stats());
      std::fprintf(stderr, "P %.2f, batch %d: %.1f tokens/s, speedup %.2f, acceptance %.3f, mean accepted %.2f\n",
                   a.acceptance[k], b, *t, *t / baseline[i], r["acceptance"]["acceptance_rate"].get<double>(),
                   r["acceptance"]["mean_accepted_per_step"].get<double>());
      runs.push_back(r);
    }
  }
  out["runs"] = runs;
  const std::string text = out.dump(2) + "\n";
  std::fputs(text.c_str(), stdout);
  if (!a.json.empty()) std::ofstream(a.json) << text;
  return 0;
}

template <typename T>
bool ParseList(const std::string& s, std::vector<T>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v)) return false;
    out->push_back(static_cast<T>(v));
  }
  return !out->empty();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    bool ok = true;
    if (k == "--config") a.config = v;
    else if (k == "--device") a.device = v;
    else if (k == "--json") a.json = v;
    else if (k == "--acceptance") ok = tandem::ParseList(v, &a.acceptance);
    else if (k == "--batches") ok = tandem::ParseList(v, &a.batches);
    else if (k == "--drafts") ok = absl::SimpleAtoi(v, &a.drafts);
    else if (k == "--prompt") ok = absl::SimpleAtoi(v, &a.prompt);
    else if (k == "--output") ok = absl::SimpleAtoi(v, &a.output);
    else if (k == "--min-confidence") ok = absl::SimpleAtof(v, &a.min_confidence);
    else if (k == "--seed") ok = absl::SimpleAtoi(v, &a.seed);
    else if (k == "--adaptive") {
      a.adaptive = true;
      continue;
    } else {
      std::fprintf(stderr, "usage: speculative_bench --config FILE [--device cuda] [--acceptance 0.6,0.75,0.9] "
                           "[--batches 1,16,64] [--drafts 3] [--prompt 64] [--output 256] [--min-confidence 0] "
                           "[--seed 1] [--json FILE]\n");
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "speculative_bench: bad value '%s' for %s\n", v.c_str(), k.c_str());
      return 2;
    }
    ++i;
  }
  if (a.config.empty()) {
    std::fprintf(stderr, "speculative_bench: --config is required\n");
    return 2;
  }
  return tandem::Main(a);
}
