// Credentials of Tandem's internal traffic (Cluster, Prefill, Decode, KvStore and the
// workers' Generation): mutual TLS (--tls-cert, --tls-key, --tls-ca: servers require a
// client certificate signed by the CA and clients verify servers against it), a shared
// cluster token (--cluster-token-file, token_auth.h), both, or neither (loopback only,
// listen_policy.h). Every binary that serves or calls internal services declares the
// flags with AddInternalAuthFlags, loads them once, and builds its server credentials and
// channels from the result.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/security/channel_factory.h"

namespace CLI {
class App;
}  // namespace CLI

namespace tandem::security {

struct InternalAuthFlags {
  std::string tls_cert;  // PEM: this process's certificate (server and client)
  std::string tls_key;   // PEM: its private key
  std::string tls_ca;    // PEM: the CA that signs every cluster member's certificate
  std::string cluster_token_file;
};

// Declares --tls-cert, --tls-key, --tls-ca and --cluster-token-file on `app`, bound to
// `*flags` (which must outlive parsing).
void AddInternalAuthFlags(CLI::App& app, InternalAuthFlags* flags);

class InternalCredentials {
 public:
  // No credentials: plaintext, unauthenticated (allowed on loopback only).
  InternalCredentials() = default;

  // Reads the files. Errors (naming the flag): INVALID_ARGUMENT when only some of the
  // three TLS flags are given or a file is not PEM or a token is too short; NOT_FOUND when
  // a file cannot be read.
  static absl::StatusOr<InternalCredentials> Load(const InternalAuthFlags& flags);

  bool tls() const { return !cert_.empty(); }
  bool token() const { return !token_.empty(); }
  bool authenticated() const { return tls() || token(); }
  // "mutual TLS", "cluster token", "mutual TLS + cluster token" or "none".
  std::string Describe() const;

  // For ServerBuilder::AddListeningPort of an internal port.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // A channel to an internal service at `address` that presents these credentials.
  std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address,
                                               const grpc::ChannelArguments& args = {}) const;
  // CreateChannel as a factory (holds a copy of the credentials).
  security::ChannelFactory ChannelFactory() const;

 private:
  std::string ca_, cert_, key_, token_;
};

}  // namespace tandem::security
