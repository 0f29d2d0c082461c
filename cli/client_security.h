// What a CLI client presents to a Tandem server: TLS verification of the server (--tls-ca),
// a client certificate or the cluster token for internal ports (`tandem status`, or bench
// against a worker), and an API key for the public API (--api-key, or TANDEM_API_KEY).
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace tandem::cli {

struct ClientSecurityArgs {
  std::string tls_ca;              // verify the server against this CA (PEM); empty: plaintext
  std::string tls_cert, tls_key;   // client certificate (internal ports)
  std::string cluster_token_file;  // internal ports without mutual TLS
  std::string api_key;             // public API: sent as authorization: Bearer KEY
};

// Declares --tls-ca and --api-key; with `internal` also --tls-cert, --tls-key and
// --cluster-token-file. Only the key reads a variable (TANDEM_API_KEY): the servers'
// TANDEM_TLS_* variables name the internal CA, which public clients must not pick up.
inline void AddClientSecurityFlags(CLI::App* cmd, ClientSecurityArgs* a, bool internal) {
  cmd->add_option("--tls-ca", a->tls_ca,
                  "Connect over TLS and verify the server against this CA certificate (PEM); serve-local prints its "
                  "path and writes it into its ready file")
      ->type_name("PEM");
  cmd->add_option("--api-key", a->api_key,
                  "API key sent as 'authorization: Bearer KEY' (servers started with --api-keys-file); prefer the "
                  "TANDEM_API_KEY variable, which other users cannot see in the process list")
      ->envname("TANDEM_API_KEY");
  if (!internal) return;
  cmd->add_option("--tls-cert", a->tls_cert, "Client certificate (PEM) for an internal port with mutual TLS")
      ->type_name("PEM");
  cmd->add_option("--tls-key", a->tls_key, "The private key of --tls-cert (PEM)")
      ->type_name("PEM");
  cmd->add_option("--cluster-token-file", a->cluster_token_file,
                  "The cluster token, for an internal port without mutual TLS")
      ->type_name("PATH");
}

}  // namespace tandem::cli
