#include "engine/runtime/constraint_compiler.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/grammar/vocabulary.h"

namespace tandem {

ConstraintCompiler::ConstraintCompiler(const Tokenizer* tokenizer, std::vector<int32_t> end_tokens,
                                       ConstraintCompilerOptions options)
    : tokenizer_(tokenizer), end_tokens_(std::move(end_tokens)), options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

ConstraintCompiler::~ConstraintCompiler() { Shutdown(); }

void ConstraintCompiler::Shutdown() {
  std::deque<Job> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Job& j : left) j.done(absl::UnavailableError("the constraint compiler shut down"));
}

void ConstraintCompiler::Compile(OutputConstraint constraint, Done done) {
  if (absl::Status s = Validate(constraint); !s.ok()) return done(s);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) {
      lock.unlock();
      return done(absl::UnavailableError("the constraint compiler shut down"));
    }
    if (queue_.size() >= options_.max_queued) {
      lock.unlock();
      return done(absl::ResourceExhaustedError(
          absl::StrCat(options_.max_queued, " constraints are waiting to be compiled; retry later")));
    }
    queue_.push_back({std::move(constraint), std::move(done)});
  }
  cv_.notify_one();
}

ConstraintCompiler::Stats ConstraintCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void ConstraintCompiler::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    const uint64_t hits_before = compiler_ ? compiler_->cache_stats().hits : 0;
    absl::StatusOr<Grammar> g = Run(job.constraint);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      (g.ok() ? stats_.compiled : stats_.failed)++;
      stats_.cache_hits += compiler_->cache_stats().hits - hits_before;
      stats_.compile_seconds += seconds;
    }
    job.done(std::move(g));
  }
}

absl::StatusOr<ConstraintCompiler::Grammar> ConstraintCompiler::Run(const OutputConstraint& c) {
  if (!compiler_) {
    // The vocabulary's trie (every token's bytes) is built once, here rather than at
    // startup: servers without constrained requests never pay for it.
    compiler_ = std::make_unique<grammar::GrammarCompiler>(
        grammar::GrammarVocabulary::FromTokenizer(*tokenizer_, end_tokens_),
        grammar::GrammarCompilerOptions{.cache_capacity = options_.cache_capacity});
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::StatusOr<Grammar> g;
  switch (c.kind) {
    case OutputConstraint::Kind::kJsonSchema: g = compiler_->CompileJsonSchema(c.text, c.json, deadline); break;
    case OutputConstraint::Kind::kJsonObject: g = compiler_->CompileJsonObject(c.json, deadline); break;
    case OutputConstraint::Kind::kRegex: g = compiler_->CompileRegex(c.text, deadline); break;
    case OutputConstraint::Kind::kEbnf: g = compiler_->CompileEbnf(c.text, c.root, c.json_rules, c.json, deadline); break;
    case OutputConstraint::Kind::kNone: return absl::InvalidArgumentError("constraint: none to compile");
  }
  if (!g.ok() && (absl::IsDeadlineExceeded(g.status()) || absl::Now() > deadline)) {
    return absl::InvalidArgumentError(absl::StrCat("constraint.", KindName(c.kind), ": compiling it took longer than ",
                                                   absl::ToInt64Milliseconds(options_.timeout),
                                                   " ms (--grammar-compile-timeout-ms)"));
  }
  if (!g.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("constraint.", KindName(c.kind), ": ", g.status().message()));
  }
  return g;
}

}  // namespace tandem
