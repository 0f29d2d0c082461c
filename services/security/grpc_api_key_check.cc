#include "services/security/grpc_api_key_check.h"

#include <string>

namespace tandem::security {
namespace {

constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";  // as services/router/admission.h

grpc::StatusCode ToGrpc(absl::StatusCode c) {
  return c == absl::StatusCode::kResourceExhausted ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                                   : grpc::StatusCode::UNAUTHENTICATED;
}

}  // namespace

grpc::Status CheckApiKey(ApiKeyAuthenticator* keys, grpc::CallbackServerContext* ctx) {
  if (keys == nullptr) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  std::string authorization;
  if (auto it = md.find("authorization"); it != md.end()) authorization.assign(it->second.data(), it->second.size());
  const ApiKeyDecision d = keys->Authorize(authorization);
  if (d.status.ok()) return grpc::Status::OK;
  if (d.status.code() == absl::StatusCode::kResourceExhausted) {
    ctx->AddTrailingMetadata(kRetryPushbackKey, std::to_string(d.retry_after.count()));
  }
  return grpc::Status(ToGrpc(d.status.code()), std::string(d.status.message()));
}

}  // namespace tandem::security
