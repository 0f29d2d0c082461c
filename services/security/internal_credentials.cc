#include "services/security/internal_credentials.h"

#include <grpcpp/security/server_credentials.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "services/security/cluster_token.h"
#include "services/security/pem_file.h"
#include "services/security/token_auth.h"

namespace tandem::security {

void AddInternalAuthFlags(CLI::App& app, InternalAuthFlags* flags) {
  app.add_option("--tls-cert", flags->tls_cert,
                 "Internal traffic, mutual TLS: this process's certificate (PEM), presented as server on the internal "
                 "port and as client to other members (give --tls-key and --tls-ca too)")
      ->type_name("PEM");
  app.add_option("--tls-key", flags->tls_key, "Internal traffic, mutual TLS: the private key of --tls-cert (PEM)")
      ->type_name("PEM");
  app.add_option("--tls-ca", flags->tls_ca,
                 "Internal traffic, mutual TLS: the CA certificate (PEM) every member's certificate must be signed "
                 "by; servers require client certificates from it, clients verify servers against it")
      ->type_name("PEM");
  app.add_option("--cluster-token-file", flags->cluster_token_file,
                 "Internal traffic: a file holding a shared secret token (16+ printable characters) sent with every "
                 "internal call and required by every internal server; the fallback where mutual TLS is not set "
                 "up (it authenticates callers but does not encrypt: use it on private networks). Without TLS or a "
                 "token, internal ports may listen on loopback only")
      ->type_name("PATH");
}

absl::StatusOr<InternalCredentials> InternalCredentials::Load(const InternalAuthFlags& f) {
  InternalCredentials c;
  const int given = !f.tls_cert.empty() + !f.tls_key.empty() + !f.tls_ca.empty();
  if (given != 0 && given != 3) {
    std::string missing;
    for (auto [flag, value] : {std::pair{"--tls-cert", &f.tls_cert}, {"--tls-key", &f.tls_key},
                               {"--tls-ca", &f.tls_ca}}) {
      if (value->empty()) absl::StrAppend(&missing, missing.empty() ? "" : ", ", flag);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("mutual TLS needs --tls-cert, --tls-key and --tls-ca together; missing: ", missing));
  }
  if (given == 3) {
    absl::StatusOr<std::string> cert = ReadPemFile(f.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(f.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    if (absl::Status s = CheckKeyPair(*cert, "--tls-cert " + f.tls_cert, *key, "--tls-key " + f.tls_key); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> ca = ReadPemFile(f.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    c.cert_ = std::move(*cert);
    c.key_ = std::move(*key);
    c.ca_ = std::move(*ca);
  }
  if (!f.cluster_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadClusterTokenFile(f.cluster_token_file);
    if (!token.ok()) return token.status();
    c.token_ = std::move(*token);
  }
  return c;
}

std::string InternalCredentials::Describe() const {
  if (tls() && token()) return "mutual TLS + cluster token";
  if (tls()) return "mutual TLS";
  if (token()) return "cluster token";
  return "none";
}

std::shared_ptr<grpc::ServerCredentials> InternalCredentials::ServerCredentials() const {
  if (!tls()) return token() ? TokenCheckingInsecureServerCredentials(token_) : grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ca_;
  o.pem_key_cert_pairs.push_back({key_, cert_});
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(o);
  if (token()) AddTokenCheck(*creds, token_);
  return creds;
}

std::shared_ptr<grpc::Channel> InternalCredentials::CreateChannel(const std::string& address,
                                                                  const grpc::ChannelArguments& args) const {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (tls()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ca_;
    o.pem_private_key = key_;
    o.pem_cert_chain = cert_;
    creds = grpc::SslCredentials(o);
  }
  if (!token()) return grpc::CreateCustomChannel(address, creds, args);
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args, TokenInterceptors(token_));
}

security::ChannelFactory InternalCredentials::ChannelFactory() const {
  return [self = *this](const std::string& address, const grpc::ChannelArguments& args) {
    return self.CreateChannel(address, args);
  };
}

}  // namespace tandem::security
