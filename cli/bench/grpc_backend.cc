#include "cli/bench/grpc_backend.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/client_channel.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::cli {
namespace {

// One streaming call; records its timings and signals completion.
class BenchCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  BenchCall(v1::Generation::Stub* stub, v1::GenerateRequest request, BenchClock::time_point run_start,
            double timeout_s, RequestRecord* record, std::function<void()> done)
      : request_(std::move(request)), record_(record), done_(std::move(done)) {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    start_ = BenchClock::now();
    record_->start_s = std::chrono::duration<double>(start_ - run_start).count();
    record_->prompt_tokens = request_.token_ids().ids_size();
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const auto now = BenchClock::now();
    if (msg_.token_ids_size() > 0) {
      if (record_->output_tokens == 0) {
        record_->ttft_s = std::chrono::duration<double>(now - start_).count();
      } else {
        record_->itl_s.push_back(std::chrono::duration<double>(now - last_).count());
      }
      record_->output_tokens += msg_.token_ids_size();
      ++record_->chunks;
      last_ = now;
    }
    if (msg_.has_usage()) {
      record_->cached_prompt_tokens = msg_.usage().cached_prompt_tokens();
      record_->draft_tokens = msg_.usage().draft_tokens();
      record_->accepted_draft_tokens = msg_.usage().accepted_draft_tokens();
    }
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    record_->ok = s.ok();
    if (!s.ok()) {
      record_->error = absl::StrCat(static_cast<int>(s.error_code()), ": ", s.error_message());
      record_->error_class =
          absl::StrCat("grpc ", absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())));
    }
    record_->e2e_s = std::chrono::duration<double>(BenchClock::now() - start_).count();
    std::function<void()> done = std::move(done_);
    delete this;
    done();
  }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse msg_;
  BenchClock::time_point start_, last_;
  RequestRecord* record_;
  std::function<void()> done_;
};

class GrpcBackend : public BenchBackend {
 public:
  GrpcBackend(std::string addr, ClientSecurityArgs security, RequestSettings settings)
      : addr_(std::move(addr)), security_(std::move(security)), settings_(std::move(settings)) {}

  std::string name() const override { return "grpc"; }

  absl::StatusOr<ServedModel> Connect() override {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenClientChannel(addr_, security_);
    if (!channel.ok()) return channel.status();
    stub_ = v1::Generation::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListModelsResponse models;
    grpc::Status s = stub_->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!s.ok() || models.models().empty()) {
      return absl::UnavailableError(absl::StrCat("cannot reach a Tandem endpoint at ", addr_, ": ", s.error_message()));
    }
    return ServedModel{.id = models.models(0).id(), .vocab_size = models.models(0).vocab_size()};
  }

  void Start(const BenchPrompt& prompt, BenchClock::time_point run_start, RequestRecord* record,
             std::function<void()> done) override {
    v1::GenerateRequest r;
    r.set_model(settings_.model);
    r.mutable_token_ids()->mutable_ids()->Assign(prompt.token_ids.begin(), prompt.token_ids.end());
    r.mutable_sampling()->set_temperature(static_cast<float>(settings_.temperature));
    r.mutable_sampling()->set_seed(prompt.seed);
    r.mutable_stop()->set_max_tokens(prompt.max_tokens);
    r.mutable_stop()->set_ignore_eos(settings_.ignore_eos);
    // Owns itself until OnDone.
    new BenchCall(stub_.get(), std::move(r), run_start, settings_.timeout_s, record, std::move(done));
  }

 private:
  const std::string addr_;
  const ClientSecurityArgs security_;
  const RequestSettings settings_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace

std::unique_ptr<BenchBackend> MakeGrpcBackend(std::string addr, ClientSecurityArgs security, RequestSettings settings) {
  return std::make_unique<GrpcBackend>(std::move(addr), std::move(security), std::move(settings));
}

}  // namespace tandem::cli
