// What the load generator drives: one way of sending a streaming generation request to a
// server (Tandem's gRPC Generate, or the OpenAI-compatible HTTP API's completions or
// chat) and timing what comes back. The load generator owns the dataset, the arrival
// process and the concurrency cap; a backend owns its transport and its connections.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/bench/bench_report.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {

using BenchClock = std::chrono::steady_clock;

// One request of the dataset. Every backend sends token_ids except openai-chat, which
// sends `text` (filled by its Prepare: chat messages carry text, not token ids).
struct BenchPrompt {
  std::vector<int32_t> token_ids;
  std::string text;
  int32_t max_tokens = 1;
  uint64_t seed = 0;
};

// What every request of a run shares.
struct RequestSettings {
  std::string model;  // empty: the served one
  double temperature = 0;
  bool ignore_eos = false;
  double timeout_s = 600;
};

struct ServedModel {
  std::string id;
  int64_t vocab_size = 0;  // 0: the API does not say (OpenAI's /v1/models)
};

class BenchBackend {
 public:
  virtual ~BenchBackend() = default;

  // "grpc", "openai-completions" or "openai-chat" (the JSON's `backend`).
  virtual std::string name() const = 0;

  // Reaches the server and learns the model it serves. UNAVAILABLE when it cannot be
  // reached or serves nothing.
  virtual absl::StatusOr<ServedModel> Connect() = 0;

  // The vocabulary size, learned some other way when Connect could not say.
  // UNIMPLEMENTED when this backend has no way.
  virtual absl::StatusOr<int64_t> ProbeVocabSize() {
    return absl::UnimplementedError(name() + ": the server does not say its vocabulary size: pass --vocab-size");
  }

  // Turns the dataset's prompts into what this backend sends, before anything is timed.
  virtual absl::Status Prepare(std::vector<BenchPrompt>* prompts) { return absl::OkStatus(); }

  // Starts one streaming request. `prompt` is only read during the call. The backend
  // fills *record (start_s relative to run_start) and then runs `done` exactly once, on
  // one of its own threads; *record is final by then. Never blocks on the server.
  virtual void Start(const BenchPrompt& prompt, BenchClock::time_point run_start, RequestRecord* record,
                     std::function<void()> done) = 0;

  // Figures of the transport itself for the JSON (HTTP: connections opened), or null.
  virtual nlohmann::json TransportStats() const { return nullptr; }
};

}  // namespace tandem::cli
