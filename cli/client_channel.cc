#include "cli/client_channel.h"

#include "services/security/internal_credentials.h"
#include "services/security/public_credentials.h"
#include "services/security/token_auth.h"

namespace tandem::cli {

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenClientChannel(const std::string& addr,
                                                                 const ClientSecurityArgs& a) {
  if (!a.tls_cert.empty() || !a.tls_key.empty() || !a.cluster_token_file.empty()) {
    const bool mutual_tls = !a.tls_cert.empty() || !a.tls_key.empty();
    if (!mutual_tls && !a.tls_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-ca with --cluster-token-file: Tandem's internal TLS ports require a client certificate (--tls-cert, "
          "--tls-key)");
    }
    absl::StatusOr<security::InternalCredentials> c = security::InternalCredentials::Load(
        {.tls_cert = a.tls_cert, .tls_key = a.tls_key, .tls_ca = mutual_tls ? a.tls_ca : "",
         .cluster_token_file = a.cluster_token_file});
    if (!c.ok()) return c.status();
    return c->CreateChannel(addr);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      security::PublicChannelCredentials(a.tls_ca, "--tls-ca");
  if (!creds.ok()) return creds.status();
  if (a.api_key.empty()) return grpc::CreateChannel(addr, *creds);
  // The key as explicit metadata on every call (call credentials would go over TLS only).
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(security::MetadataInterceptor("authorization", "Bearer " + a.api_key));
  return grpc::experimental::CreateCustomChannelWithInterceptors(addr, *creds, grpc::ChannelArguments(),
                                                                 std::move(interceptors));
}

}  // namespace tandem::cli
