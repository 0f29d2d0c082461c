// Compiles requests' output constraints off the engine thread and off the callers'
// threads: one compile thread with a bounded queue, in front of a GrammarCompiler (its
// LRU cache keyed by the constraint's content) for the engine's vocabulary, built on the
// first constrained request. A compile that passes its deadline fails with
// INVALID_ARGUMENT, so a hostile schema costs at most that much of the thread.
//
// Thread-safe. `done` runs on the compile thread (keep it short: post elsewhere), or
// inline when the job is refused before it is queued; exactly once, also at shutdown
// (UNAVAILABLE for jobs not started).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/grammar_compiler.h"
#include "engine/runtime/output_constraint.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

struct ConstraintCompilerOptions {
  // Per compile, from when it starts (--grammar-compile-timeout-ms).
  absl::Duration timeout = absl::Milliseconds(5000);
  // Jobs waiting for the thread; beyond: RESOURCE_EXHAUSTED at once.
  size_t max_queued = 256;
  size_t cache_capacity = 64;
};

class ConstraintCompiler {
 public:
  using Grammar = std::shared_ptr<const grammar::CompiledGrammar>;
  using Done = std::function<void(absl::StatusOr<Grammar>)>;

  // `tokenizer` must outlive this; `end_tokens`: the ids a grammar allows where it may end
  // (the engine's EOS ids).
  ConstraintCompiler(const Tokenizer* tokenizer, std::vector<int32_t> end_tokens, ConstraintCompilerOptions options);
  ~ConstraintCompiler();  // Shutdown()
  // Waits for the compile in progress (at most its timeout), then ends the queued jobs
  // with UNAVAILABLE; later Compile calls are refused so. Idempotent.
  void Shutdown();

  void Compile(OutputConstraint constraint, Done done);

  struct Stats {
    uint64_t compiled = 0;  // compiles that succeeded (cache hits included)
    uint64_t failed = 0;
    uint64_t cache_hits = 0;
    double compile_seconds = 0;  // total time of the compiles that ran
  };
  Stats stats() const;

 private:
  struct Job {
    OutputConstraint constraint;
    Done done;
  };
  void Loop();
  absl::StatusOr<Grammar> Run(const OutputConstraint& c);

  const Tokenizer* tokenizer_;
  std::vector<int32_t> end_tokens_;
  ConstraintCompilerOptions options_;
  std::unique_ptr<grammar::GrammarCompiler> compiler_;  // compile thread only; built on first use

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool stop_ = false;      // guarded by mu_
  Stats stats_;            // guarded by mu_
  std::thread thread_;
};

}  // namespace tandem
