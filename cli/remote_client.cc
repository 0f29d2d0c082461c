#include "cli/remote_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "cli/client_channel.h"
#include "services/api/proto_convert.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem::cli {
namespace {

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    default: return "ERROR";
  }
}

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    default: return "none";
  }
}

}  // namespace

int RunRemoteGenerate(const RemoteGenerateArgs& a) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenClientChannel(a.addr, a.security);
  if (!channel.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::Generation::NewStub(*channel);
  v1::GenerateRequest req;
  req.set_model(a.model);
  req.set_text(a.prompt);
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(static_cast<float>(a.temperature));
  s->set_top_p(static_cast<float>(a.top_p));
  s->set_top_k(a.top_k);
  s->set_min_p(static_cast<float>(a.min_p));
  s->set_repetition_penalty(static_cast<float>(a.repetition_penalty));
  s->set_presence_penalty(static_cast<float>(a.presence_penalty));
  s->set_frequency_penalty(static_cast<float>(a.frequency_penalty));
  if (a.seed >= 0) s->set_seed(static_cast<uint64_t>(a.seed));
  v1::StopConditions* st = req.mutable_stop();
  st->set_max_tokens(a.max_tokens);
  for (const auto& x : a.stop) st->add_stop(x);
  st->set_ignore_eos(a.ignore_eos);
  if (a.constraint.active()) ToProto(a.constraint, req.mutable_constraint());

  grpc::ClientContext ctx;
  if (a.timeout_s > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp, last;
  std::string request_id;
  double first_ms = -1;
  int tokens = 0;
  while (reader->Read(&resp)) {
    if (first_ms < 0 && resp.token_ids_size() > 0) {
      first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!resp.request_id().empty()) request_id = resp.request_id();
    tokens += resp.token_ids_size();
    std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
    std::fflush(stdout);
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED || resp.has_usage()) last = resp;
  }
  grpc::Status status = reader->Finish();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem generate: %s: %s\n", CodeName(status.error_code()), status.error_message().c_str());
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1;
  }
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "request %s | finish: %s | prompt tokens: %d (cached %d) | generated tokens: %d | TTFT: %.1f ms "
               "(server %.1f, KV transfer %.1f) | decode: %.1f tokens/s",
               request_id.c_str(), FinishName(last.finish_reason()), last.usage().prompt_tokens(),
               last.usage().cached_prompt_tokens(), last.usage().completion_tokens(), first_ms,
               last.timing().ttft_ms(), last.timing().transfer_ms(),
               tokens > 1 && total_ms > first_ms ? (tokens - 1) / ((total_ms - first_ms) / 1000.0) : 0.0);
  if (const v1::Usage& u = last.usage(); u.draft_tokens() > 0) {
    std::fprintf(stderr, " | drafts accepted: %d of %d (%.1f%%)", u.accepted_draft_tokens(), u.draft_tokens(),
                 100.0 * u.accepted_draft_tokens() / u.draft_tokens());
  }
  std::fputc('\n', stderr);
  return 0;
}

int RunStatus(const std::string& addr, bool json, const ClientSecurityArgs& security) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenClientChannel(addr, security);
  if (!channel.ok()) {
    std::fprintf(stderr, "tandem status: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::Cluster::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListReplicasResponse resp;
  grpc::Status s = stub->ListReplicas(&ctx, v1::ListReplicasRequest(), &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "tandem status: %s: %s\n", CodeName(s.error_code()), s.error_message().c_str());
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      std::fprintf(stderr, "tandem status: %s is not an internal port: give the router's --internal-listen address "
                           "(\"internal\" in its ready file)\n", addr.c_str());
    }
    return 1;
  }
  if (json) {
    nlohmann::json j = {{"model", resp.model()}, {"replicas", nlohmann::json::array()}};
    for (const auto& r : resp.replicas()) {
      j["replicas"].push_back({{"id", r.replica_id()}, {"role", v1::Role_Name(r.role())}, {"grpc", r.grpc_address()},
                               {"admin", r.admin_address()}, {"state", r.state()}, {"outstanding", r.outstanding()},
                               {"waiting", r.load().waiting()}, {"running", r.load().running()},
                               {"kv_usage", r.load().kv_usage()}, {"kv_blocks_free", r.load().kv_blocks_free()},
                               {"kv_blocks_total", r.load().kv_blocks_total()}, {"pid", r.pid()},
                               {"last_heartbeat_ms_ago", r.last_heartbeat_ms_ago()}});
      if (r.load().rank_kv_blocks_free_size() > 0) {  // a data-parallel replica: each rank's room
        j["replicas"].back()["rank_kv_blocks_free"] =
            std::vector<int64_t>(r.load().rank_kv_blocks_free().begin(), r.load().rank_kv_blocks_free().end());
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model: %s, %d replicas\n", resp.model().c_str(), resp.replicas_size());
  std::printf("%-12s %-8s %-22s %-22s %-9s %7s %7s %7s %9s %9s\n", "REPLICA", "ROLE", "GRPC", "ADMIN", "STATE",
              "INFLT", "RUN", "WAIT", "KV USED", "HEARTBEAT");
  for (const auto& r : resp.replicas()) {
    const char* role = r.role() == v1::ROLE_PREFILL  ? "prefill"
                       : r.role() == v1::ROLE_DECODE ? "decode"
                       : r.role() == v1::ROLE_KVSTORE ? "kvstore"
                                                      : "both";
    std::printf("%-12s %-8s %-22s %-22s %-9s %7d %7d %7d %8.1f%% %7lldms\n", r.replica_id().c_str(), role,
                r.grpc_address().c_str(), r.admin_address().c_str(), r.state().c_str(), r.outstanding(),
                r.load().running(), r.load().waiting(), 100.0 * r.load().kv_usage(),
                static_cast<long long>(r.last_heartbeat_ms_ago()));
  }
  return 0;
}

}  // namespace tandem::cli
