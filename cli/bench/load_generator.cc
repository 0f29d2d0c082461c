#include "cli/bench/load_generator.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/client_channel.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;

class Semaphore {
 public:
  explicit Semaphore(int n) : n_(n) {}
  void Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return n_ > 0; });
    --n_;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++n_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
};

// One streaming call; records its timings and signals completion.
class BenchCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  BenchCall(v1::Generation::Stub* stub, v1::GenerateRequest request, Clock::time_point run_start, double timeout_s,
            RequestRecord* record, std::function<void()> done)
      : request_(std::move(request)), run_start_(run_start), record_(record), done_(std::move(done)) {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    start_ = Clock::now();
    record_->start_s = std::chrono::duration<double>(start_ - run_start_).count();
    record_->prompt_tokens = request_.token_ids().ids_size();
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const auto now = Clock::now();
    if (msg_.token_ids_size() > 0) {
      if (record_->output_tokens == 0) {
        record_->ttft_s = std::chrono::duration<double>(now - start_).count();
      } else {
        record_->itl_s.push_back(std::chrono::duration<double>(now - last_).count());
      }
      record_->output_tokens += msg_.token_ids_size();
      last_ = now;
    }
    if (msg_.has_usage()) record_->cached_prompt_tokens = msg_.usage().cached_prompt_tokens();
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    record_->ok = s.ok();
    if (!s.ok()) record_->error = absl::StrCat(static_cast<int>(s.error_code()), ": ", s.error_message());
    record_->e2e_s = std::chrono::duration<double>(Clock::now() - start_).count();
    std::function<void()> done = std::move(done_);
    delete this;
    done();
  }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse msg_;
  Clock::time_point run_start_, start_, last_;
  RequestRecord* record_;
  std::function<void()> done_;
};

int Length(int base, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return base;
  const int lo = std::max(1, static_cast<int>(std::floor(base * (1 - ratio))));
  const int hi = std::max(lo, static_cast<int>(std::ceil(base * (1 + ratio))));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

}  // namespace

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1 || o.range_ratio < 0 || o.range_ratio >= 1 ||
      o.num_prefixes < 1 || o.prefix_len < 0) {
    return absl::InvalidArgumentError("bench: counts and lengths must be positive, 0 <= range ratio < 1");
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenClientChannel(o.addr, o.security);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Generation::NewStub(*channel);
  LoadResult result;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListModelsResponse models;
    grpc::Status s = stub->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!s.ok() || models.models().empty()) {
      return absl::UnavailableError(absl::StrCat("cannot reach a Tandem endpoint at ", o.addr, ": ", s.error_message()));
    }
    result.vocab_size = models.models(0).vocab_size();
    result.model = models.models(0).id();
  }
  // Random tokens from the ordinary vocabulary (DeepSeek's special tokens sit at both ends).
  const int32_t lo = 3, hi = static_cast<int32_t>(std::min<int64_t>(result.vocab_size, 128000)) - 1;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(lo, hi);
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(o.prefix_len > 0 ? o.num_prefixes : 0));
  for (auto& p : prefixes) {
    for (int i = 0; i < o.prefix_len; ++i) p.push_back(token(rng));
  }
  auto make_request = [&](int i) {
    v1::GenerateRequest r;
    r.set_model(o.model);
    v1::TokenIds* ids = r.mutable_token_ids();
    if (!prefixes.empty()) {
      for (int32_t t : prefixes[i % prefixes.size()]) ids->add_ids(t);
    }
    const int n = Length(o.input_len, o.range_ratio, rng);
    for (int k = 0; k < n; ++k) ids->add_ids(token(rng));
    r.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
    r.mutable_sampling()->set_seed(o.seed + static_cast<uint64_t>(i));
    r.mutable_stop()->set_max_tokens(Length(o.output_len, o.range_ratio, rng));
    r.mutable_stop()->set_ignore_eos(o.ignore_eos);
    return r;
  };
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < o.num_prompts; ++i) requests.push_back(make_request(i));

  // Warm-up, one at a time, not measured, with prompts of their own: random tokens from a
  // separate generator and none of the shared prefixes, so that no measured request finds
  // a warm-up prompt in a prefix cache or the kvstore (a warm-up that resent measured
  // prompts made their TTFT that of a cache hit). The measured prompts are the same as
  // without a warm-up.
  std::mt19937_64 warmup_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  auto make_warmup = [&](int i) {
    v1::GenerateRequest r;
    r.set_model(o.model);
    v1::TokenIds* ids = r.mutable_token_ids();
    const int n = o.prefix_len + Length(o.input_len, o.range_ratio, warmup_rng);
    for (int k = 0; k < n; ++k) ids->add_ids(token(warmup_rng));
    r.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
    r.mutable_sampling()->set_seed(o.seed + static_cast<uint64_t>(o.num_prompts + i));
    r.mutable_stop()->set_max_tokens(Length(o.output_len, o.range_ratio, warmup_rng));
    r.mutable_stop()->set_ignore_eos(o.ignore_eos);
    return r;
  };
  for (int i = 0; i < o.num_warmup; ++i) {
    RequestRecord ignored;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    new BenchCall(stub.get(), make_warmup(i), Clock::now(), o.request_timeout_s, &ignored, [&] {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }

  result.records.resize(requests.size());
  Semaphore slots(o.max_concurrency > 0 ? o.max_concurrency : static_cast<int>(requests.size()));
  std::mutex mu;
  std::condition_variable all_done;
  int finished = 0, failed = 0;
  const bool poisson = o.request_rate > 0 && std::isfinite(o.request_rate);
  std::exponential_distribution<double> gap(poisson ? o.request_rate : 1.0);
  const auto start = Clock::now();
  auto next_arrival = start;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (poisson) {
      std::this_thread::sleep_until(next_arrival);
      next_arrival += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
    slots.Acquire();
    RequestRecord* rec = &result.records[i];
    new BenchCall(stub.get(), std::move(requests[i]), start, o.request_timeout_s, rec, [&, rec] {
      slots.Release();
      int d, f;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        if (!rec->ok) ++failed;
        d = finished;
        f = failed;
      }
      if (o.progress) o.progress(d, f, o.num_prompts);
      all_done.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  all_done.wait(lock, [&] { return finished == o.num_prompts; });
  result.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace tandem::cli
