#include "services/security/public_credentials.h"

#include "CLI/CLI.hpp"
#include "services/security/pem_file.h"

namespace tandem::security {

void AddPublicSecurityFlags(CLI::App& app, PublicSecurityFlags* flags) {
  app.add_option("--public-tls-cert", flags->tls_cert,
                 "Serve the public ports over TLS with this certificate (PEM; with --public-tls-key): gRPC on "
                 "--listen, HTTPS on --http-listen. Default: plaintext")
      ->type_name("PEM");
  app.add_option("--public-tls-key", flags->tls_key, "The private key of --public-tls-cert (PEM)")->type_name("PEM");
  app.add_option("--api-keys-file", flags->api_keys_file,
                 "Require an API key (authorization: Bearer KEY) on the public API and the admin pages that show "
                 "replicas. One key per line: KEY [name=NAME] [rps=N] [burst=N] (KEY: 16+ printable characters; "
                 "rps: requests per second allowed, 0 or absent = no limit; burst: requests allowed at once, default "
                 "max(1, rps)); blank lines and lines starting with # are ignored. A missing or wrong key is "
                 "UNAUTHENTICATED, a key over its rate RESOURCE_EXHAUSTED with grpc-retry-pushback-ms. Without this "
                 "flag the public API is open to anyone who can reach it")
      ->type_name("PATH");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const PublicSecurityFlags& f) {
  if (f.tls_cert.empty() && f.tls_key.empty()) return grpc::InsecureServerCredentials();
  if (f.tls_cert.empty() || f.tls_key.empty()) {
    return absl::InvalidArgumentError("public TLS needs --public-tls-cert and --public-tls-key together");
  }
  absl::StatusOr<std::string> cert = ReadPemFile(f.tls_cert, "--public-tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(f.tls_key, "--public-tls-key");
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckKeyPair(*cert, "--public-tls-cert " + f.tls_cert, *key, "--public-tls-key " + f.tls_key);
      !s.ok()) {
    return s;
  }
  grpc::SslServerCredentialsOptions o(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PublicChannelCredentials(const std::string& ca_file,
                                                                                   const std::string& flag) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPemFile(ca_file, flag);
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = *ca;
  return grpc::SslCredentials(o);
}

}  // namespace tandem::security
