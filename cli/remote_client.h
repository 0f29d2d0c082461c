// The CLI's gRPC client side: `tandem generate --addr`, `tandem status`.
#pragma once

#include <string>
#include <vector>

#include "cli/client_security.h"
#include "engine/runtime/output_constraint.h"

namespace tandem::cli {

struct RemoteGenerateArgs {
  std::string addr;
  std::string model;
  std::string prompt;
  int max_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  OutputConstraint constraint;
  double timeout_s = 0;  // 0: none
  ClientSecurityArgs security;
};

// Streams the generation to stdout, usage and timings to stderr. Returns the exit code.
int RunRemoteGenerate(const RemoteGenerateArgs& a);

// Prints the cluster's replicas (tandem.v1.Cluster/ListReplicas on the router's internal
// port, with `security`'s credentials). Returns the exit code.
int RunStatus(const std::string& addr, bool json, const ClientSecurityArgs& security);

}  // namespace tandem::cli
