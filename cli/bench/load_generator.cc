#include "cli/bench/load_generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tandem::cli {
namespace {

class Semaphore {
 public:
  explicit Semaphore(int n) : n_(n) {}
  void Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return n_ > 0; });
    --n_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
};

// Requests finished over the whole run, for the progress display.
class Progress {
 public:
  Progress(const LoadOptions& o, int total) : o_(o), total_(total) {}
  void Finished(bool ok) {
    int d, f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      if (!ok) ++failed_;
      d = done_;
      f = failed_;
    }
    if (o_.progress) o_.progress(d, f, total_);
  }

 private:
  const LoadOptions& o_;
  const int total_;
  std::mutex mu_;
  int done_ = 0, failed_ = 0;
};

// Waits until `n` requests called Done. Done notifies under the lock: once Wait returns,
// no Done touches this object any more.
class Countdown {
 public:
  explicit Countdown(int n) : left_(n) {}
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    --left_;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

// Sends prompts[begin, end) through `backend` under the arrival process and the
// concurrency cap, into records[begin, end); returns the seconds from the first arrival
// to the last answer.
double RunBatch(BenchBackend& backend, const std::vector<BenchPrompt>& prompts, size_t begin, size_t end,
                std::vector<RequestRecord>* records, const LoadOptions& o, std::mt19937_64& arrivals,
                Progress& progress) {
  const int count = static_cast<int>(end - begin);
  Semaphore slots(o.max_concurrency > 0 ? o.max_concurrency : count);
  Countdown finished(count);
  const bool poisson = o.request_rate > 0 && std::isfinite(o.request_rate);
  std::exponential_distribution<double> gap(poisson ? o.request_rate : 1.0);
  const auto start = BenchClock::now();
  auto next_arrival = start;
  for (size_t i = begin; i < end; ++i) {
    if (poisson) {
      std::this_thread::sleep_until(next_arrival);
      next_arrival +=
          std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(gap(arrivals)));
    }
    slots.Acquire();
    RequestRecord* rec = &(*records)[i];
    backend.Start(prompts[i], start, rec, [&slots, &finished, &progress, rec] {
      slots.Release();
      progress.Finished(rec->ok);
      finished.Done();
    });
  }
  finished.Wait();
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

// One at a time, not measured.
void WarmUp(BenchBackend& backend, const std::vector<BenchPrompt>& prompts) {
  for (const BenchPrompt& p : prompts) {
    RequestRecord ignored;
    Countdown finished(1);
    backend.Start(p, BenchClock::now(), &ignored, [&finished] { finished.Done(); });
    finished.Wait();
  }
}

double MedianTtftMs(const std::vector<RequestRecord>& records, size_t begin, size_t end) {
  std::vector<double> ttft;
  for (size_t i = begin; i < end; ++i) {
    if (records[i].ok) ttft.push_back(records[i].ttft_s * 1e3);
  }
  return Summarize(std::move(ttft)).median;
}

// The vocabulary of the random prompts: the option, else the first backend that knows.
absl::StatusOr<int64_t> VocabSize(const std::vector<BenchBackend*>& backends, const std::vector<ServedModel>& served,
                                  const LoadOptions& o) {
  if (o.vocab_size > 0) return o.vocab_size;
  for (const ServedModel& s : served) {
    if (s.vocab_size > 0) return s.vocab_size;
  }
  return backends.front()->ProbeVocabSize();
}

}  // namespace

absl::StatusOr<std::vector<LoadResult>> RunCompare(const std::vector<BenchBackend*>& backends,
                                                   const LoadOptions& o, int rounds) {
  if (absl::Status s = ValidateDataset(o.dataset); !s.ok()) return s;
  if (backends.empty()) return absl::InvalidArgumentError("bench: no backend");
  std::vector<ServedModel> served;
  for (BenchBackend* b : backends) {
    absl::StatusOr<ServedModel> s = b->Connect();
    if (!s.ok()) return s.status();
    if (!served.empty() && s->id != served.front().id) {
      return absl::InvalidArgumentError(absl::StrCat("bench: ", backends.front()->name(), " serves '", served.front().id,
                                                     "' but ", b->name(), " serves '", s->id,
                                                     "': compare backends of the same cluster"));
    }
    served.push_back(*s);
  }
  absl::StatusOr<int64_t> vocab = VocabSize(backends, served, o);
  if (!vocab.ok()) return vocab.status();
  const int k = static_cast<int>(backends.size());
  Dataset dataset = MakeDataset(o.dataset, *vocab, k);
  for (int b = 0; b < k; ++b) {
    if (absl::Status s = backends[b]->Prepare(&dataset.measured[b]); !s.ok()) return s;
    if (absl::Status s = backends[b]->Prepare(&dataset.warmup[b]); !s.ok()) return s;
  }
  for (int b = 0; b < k; ++b) WarmUp(*backends[b], dataset.warmup[b]);

  const size_t n = static_cast<size_t>(o.dataset.num_prompts);
  const int r_count = std::clamp(rounds, 1, o.dataset.num_prompts);
  std::vector<LoadResult> results(static_cast<size_t>(k));
  for (int b = 0; b < k; ++b) {
    results[b].backend = backends[b]->name();
    results[b].records.resize(n);
    results[b].vocab_size = *vocab;
    results[b].model = served[b].id;
  }
  Progress progress(o, static_cast<int>(n) * k);
  std::mt19937_64 arrivals(o.dataset.seed ^ 0x2545f4914f6cdd1dULL);
  for (int r = 0; r < r_count; ++r) {
    const size_t begin = n * r / r_count, end = n * (r + 1) / r_count;
    for (int j = 0; j < k; ++j) {
      const int b = r % 2 == 0 ? j : k - 1 - j;  // A B, B A, ...: drift falls on both
      results[b].duration_s +=
          RunBatch(*backends[b], dataset.measured[b], begin, end, &results[b].records, o, arrivals, progress);
      if (k > 1) results[b].round_ttft_p50_ms.push_back(MedianTtftMs(results[b].records, begin, end));
    }
  }
  for (int b = 0; b < k; ++b) results[b].transport = backends[b]->TransportStats();
  return results;
}

absl::StatusOr<LoadResult> RunLoad(BenchBackend& backend, const LoadOptions& o) {
  absl::StatusOr<std::vector<LoadResult>> results = RunCompare({&backend}, o, 1);
  if (!results.ok()) return results.status();
  return std::move(results->front());
}

}  // namespace tandem::cli
