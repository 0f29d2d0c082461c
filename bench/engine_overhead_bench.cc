// The engine's host time per step, without a model: a backend whose forward pass costs
// nothing and which chooses tokens "on the device" (as the CUDA backend does with device
// sampling), so that everything measured is the engine's own work between two GPU steps:
// scheduling, batch assembly, stop checks and text deltas, output streams, stats. Run
// with the shape of a served GPU workload (64 streams of 256 prompt + 128 generated
// tokens, the V2-Lite config and a 102,400-entry generated tokenizer), a consumer thread
// draining every stream like the gRPC reactors. The figure is absolute (host µs per
// step): there is no model step in this run to divide it by. Compare it with a step time
// measured on the same machine in one run (cuda_model_bench reports those); a share
// computed against a step measured elsewhere would mix two machines.
//
//   engine_overhead_bench --model DIR [--streams 64] [--prompt 256] [--output 128] [--json FILE]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_backend.h"
#include "engine/model/model_config.h"
#include "engine/runtime/engine.h"
#include "engine/util/mapped_file.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// Every forward pass is free; tokens are a function of the row's seed and step.
class FreeBackend : public ModelBackend {
 public:
  explicit FreeBackend(ModelConfig c) : config_(std::move(c)) {}
  const ModelConfig& config() const override { return config_; }
  std::string device_name() const override { return "free"; }
  bool kv_in_host_pool() const override { return false; }
  int64_t device_kv_blocks() const override { return 1 << 14; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool&,
                                             const ForwardOptions&) override {
    int64_t rows = 0;
    for (const ForwardSequence& s : batch) rows += s.no_logits ? 0 : 1;
    return std::vector<float>(static_cast<size_t>(rows * config_.vocab_size), 0.0f);
  }
  bool samples_on_device() const override { return true; }
  absl::StatusOr<std::vector<int32_t>> ForwardSample(std::span<const ForwardSequence>, KvPool&,
                                                     std::span<const SampleRow> rows,
                                                     const ForwardOptions&) override {
    std::vector<int32_t> out;
    out.reserve(rows.size());
    for (const SampleRow& r : rows) {
      out.push_back(static_cast<int32_t>(1000 + (r.seed * 7919 + static_cast<uint64_t>(r.step) * 104729) % 60000));
    }
    return out;
  }

 private:
  ModelConfig config_;
};

int Run(int argc, char** argv) {
  std::string model, json;
  int streams = 64, prompt = 256, output = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") model = next();
    else if (a == "--streams") streams = std::stoi(next());
    else if (a == "--prompt") prompt = std::stoi(next());
    else if (a == "--output") output = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr, "usage: engine_overhead_bench --model DIR [--streams N] [--prompt N] [--output N] "
                           "[--json FILE]\n");
      return 2;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "--model DIR is required (a checkpoint directory: config.json and tokenizer)\n");
    return 2;
  }
  EngineOptions o;
  o.max_running = streams;
  o.max_batch_tokens = 2048;
  o.backend_factory = [](const std::string& dir) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
    absl::StatusOr<std::string> text = ReadFileToString(dir + "/config.json");
    if (!text.ok()) return text.status();
    absl::StatusOr<ModelConfig> c = ParseModelConfig(*text);
    if (!c.ok()) return c.status();
    return std::unique_ptr<ModelBackend>(new FreeBackend(*c));
  };
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model, o);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  Engine& e = **engine;
  // Two rounds: the first warms the tokenizer's caches and the allocator.
  nlohmann::json rounds = nlohmann::json::array();
  double host_us_per_step = 0;
  for (int round = 0; round < 2; ++round) {
    const EngineStats before = e.Stats();
    std::vector<std::shared_ptr<OutputStream>> outs;
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < streams; ++s) {
      EngineRequest r;
      r.id = absl::StrCat("r", round, "-", s);
      for (int t = 0; t < prompt; ++t) r.prompt.push_back(1000 + (s * 131 + t * 17 + round) % 60000);
      r.sampling.temperature = 0.8f;
      r.sampling.seed = static_cast<uint64_t>(s + 1);
      r.stop.max_tokens = output;
      r.stop.ignore_eos = true;
      absl::StatusOr<std::shared_ptr<OutputStream>> st = e.Submit(std::move(r));
      if (!st.ok()) {
        std::fprintf(stderr, "submit: %s\n", std::string(st.status().message()).c_str());
        return 1;
      }
      outs.push_back(*st);
    }
    // One consumer drains every stream, as the gRPC reactors would.
    std::atomic<int64_t> tokens{0};
    std::thread consumer([&] {
      for (auto& s : outs) {
        RequestOutput out;
        while (s->Next(&out)) tokens += static_cast<int64_t>(out.token_ids.size());
      }
    });
    consumer.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const EngineStats after = e.Stats();
    const int64_t steps = after.steps - before.steps;
    host_us_per_step = wall * 1e6 / static_cast<double>(steps);
    rounds.push_back({{"wall_s", wall}, {"steps", steps}, {"tokens", tokens.load()},
                      {"host_us_per_step", host_us_per_step}});
  }
  nlohmann::json out = {{"benchmark", "engine_overhead"},
                        {"streams", streams},
                        {"prompt", prompt},
                        {"output", output},
                        {"rounds", rounds},
                        {"host_us_per_step", host_us_per_step},
                        {"host_threads", std::thread::hardware_concurrency()}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Run(argc, argv); }
