// The public port's credentials (the router's tandem.v1.Generation): plaintext by default,
// or server-side TLS with --public-tls-cert and --public-tls-key. Clients are identified
// by API keys (api_key_authenticator.h), not by certificates.
//
// Why flags of their own rather than --tls-*: the internal CA is the cluster's private
// authority, and a client certificate it signs is a key to the control plane; the public
// certificate is usually issued by another CA, for the public name, and public clients
// must never get certificates of the internal one.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::security {

struct PublicSecurityFlags {
  std::string tls_cert;       // --public-tls-cert
  std::string tls_key;        // --public-tls-key
  std::string api_keys_file;  // --api-keys-file
};

// Declares --public-tls-cert, --public-tls-key and --api-keys-file on `app`.
void AddPublicSecurityFlags(CLI::App& app, PublicSecurityFlags* flags);

// Insecure credentials without TLS flags, TLS (no client certificates) with both.
// Errors: INVALID_ARGUMENT when only one is given, those of ReadPemFile.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(const PublicSecurityFlags& flags);

// A client's credentials for the public port: TLS verified against the CA in `ca_file`
// (PEM), or plaintext when it is empty. Errors: those of ReadPemFile (naming `flag`).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PublicChannelCredentials(const std::string& ca_file,
                                                                                   const std::string& flag);

}  // namespace tandem::security
