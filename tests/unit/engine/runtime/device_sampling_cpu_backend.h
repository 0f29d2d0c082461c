// A CPU backend that chooses tokens "on the device" (ModelBackend::ForwardSample: the CPU
// model's logits through the same Sampler the engine uses on the host, so the tokens are
// the host path's), for the engine's pipelined steps on machines without a GPU. With
// `defer`, a launched step is computed only when it is collected, as a GPU stream would
// compute it: after everything the engine did meanwhile (scheduling the next step,
// emitting outputs, freeing and reallocating blocks, commands), from the inputs it copied
// at the launch.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/model_backend.h"
#include "engine/runtime/output_constraint.h"
#include "engine/runtime/sampler.h"

namespace tandem::testing {

class DeviceSamplingCpuBackend : public ModelBackend {
 public:
  DeviceSamplingCpuBackend(std::unique_ptr<DeepseekModel> model, bool defer)
      : model_(std::move(model)), defer_(defer) {}

  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return "cpu (device sampling)"; }
  bool kv_in_host_pool() const override { return true; }
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardSequence> batch, KvPool& pool,
                                             const ForwardOptions& options) override {
    LatentKvCache host = LatentKvCache::Of(pool);
    return model_->Forward(batch, host, ForDeepseek(options));
  }
  bool samples_on_device() const override { return true; }
  bool has_mtp() const override { return model_->has_mtp(); }
  absl::StatusOr<std::vector<std::vector<DraftToken>>> Draft(std::span<const DraftSequence> batch,
                                                             KvPool& pool) override {
    LatentKvCache host = LatentKvCache::Of(pool);
    return model_->Draft(batch, host);
  }
  absl::StatusOr<std::vector<int32_t>> ForwardSample(std::span<const ForwardSequence> batch, KvPool& pool,
                                                     std::span<const SampleRow> rows,
                                                     const ForwardOptions& options) override {
    LatentKvCache host = LatentKvCache::Of(pool);
    absl::StatusOr<std::vector<float>> logits = model_->Forward(batch, host, ForDeepseek(options));
    if (!logits.ok()) return logits.status();
    if (options.before_sampling) options.before_sampling();
    const int64_t vocab = model_->config().vocab_size;
    if (static_cast<int64_t>(logits->size()) != static_cast<int64_t>(rows.size()) * vocab) {
      return absl::InvalidArgumentError("sampling rows do not match the logits rows");
    }
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < rows.size(); ++i) {
      const SampleRow& r = rows[i];
      SamplingParams p;
      p.temperature = r.temperature;
      p.top_p = r.top_p;
      p.top_k = r.top_k;
      p.min_p = r.min_p;
      p.repetition_penalty = r.repetition_penalty;
      p.presence_penalty = r.presence_penalty;
      p.frequency_penalty = r.frequency_penalty;
      std::span<float> lg(logits->data() + i * vocab, static_cast<size_t>(vocab));
      if (!r.allowed.empty()) MaskLogits(lg, r.allowed);
      tokens.push_back(sampler_.Sample(lg, p, r.seed, r.step, r.prompt_tokens, r.output_tokens).token);
    }
    ++steps_computed_;
    return tokens;
  }

  // The n-th launch (from 1) fails (a device error), or with `at_collect` its collection.
  void FailLaunch(int64_t n, bool at_collect) {
    fail_launch_ = n;
    fail_at_collect_ = at_collect;
  }

  absl::Status LaunchSample(std::span<const ForwardSequence> batch, KvPool& host,
                            std::span<const SampleRow> rows, const ForwardOptions& options) override {
    if (++launches_ == fail_launch_) {
      if (!fail_at_collect_) return absl::InternalError("injected launch failure");
      failing_ = true;
      return absl::OkStatus();
    }
    if (!defer_) return ModelBackend::LaunchSample(batch, host, rows, options);
    // Everything the step reads, copied now: the engine changes the sequences afterwards.
    // (The masks are filled first, as a GPU's host would while the forward pass runs.)
    if (options.before_sampling) options.before_sampling();
    Launched l;
    l.host = &host;
    for (const ForwardSequence& s : batch) {
      l.tokens.emplace_back(s.tokens.begin(), s.tokens.end());
      l.tables.emplace_back(s.block_table.begin(), s.block_table.end());
      l.sequences.push_back(s);
    }
    for (const SampleRow& r : rows) {
      l.histories.emplace_back(r.prompt_tokens.begin(), r.prompt_tokens.end());
      l.histories.emplace_back(r.output_tokens.begin(), r.output_tokens.end());
      l.masks.emplace_back(r.allowed.begin(), r.allowed.end());
      l.rows.push_back(r);
    }
    launched_ = std::move(l);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<int32_t>> CollectSample() override {
    if (failing_) {
      failing_ = false;
      launched_.reset();
      return absl::InternalError("injected collection failure");
    }
    if (!defer_) return ModelBackend::CollectSample();
    if (!launched_) return absl::FailedPreconditionError("no step launched");
    Launched l = std::move(*launched_);
    launched_.reset();
    for (size_t i = 0; i < l.sequences.size(); ++i) {
      l.sequences[i].tokens = l.tokens[i];
      l.sequences[i].block_table = l.tables[i];
    }
    for (size_t i = 0; i < l.rows.size(); ++i) {
      l.rows[i].prompt_tokens = l.histories[2 * i];
      l.rows[i].output_tokens = l.histories[2 * i + 1];
      l.rows[i].allowed = l.masks[i];
    }
    return ForwardSample(l.sequences, *l.host, l.rows, ForwardOptions{});
  }

  int64_t launches() const { return launches_; }
  int64_t steps_computed() const { return steps_computed_; }

 private:
  struct Launched {
    KvPool* host = nullptr;
    std::vector<std::vector<int32_t>> tokens, tables, histories;
    std::vector<std::vector<uint32_t>> masks;
    std::vector<ForwardSequence> sequences;
    std::vector<SampleRow> rows;
  };
  std::unique_ptr<DeepseekModel> model_;
  bool defer_;
  Sampler sampler_;
  std::optional<Launched> launched_;
  std::atomic<int64_t> launches_{0};  // read by tests on other threads
  int64_t fail_launch_ = 0;
  bool fail_at_collect_ = false;
  bool failing_ = false;
  std::atomic<int64_t> steps_computed_{0};
};

}  // namespace tandem::testing
