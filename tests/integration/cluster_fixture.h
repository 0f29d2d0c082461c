// Helpers for integration tests of the served system: a LocalCluster of the real
// binaries on loopback (ephemeral ports, ready files), a gRPC client that collects a
// whole stream, a tiny HTTP GET for admin endpoints, and an in-process engine on the same
// model as the reference for exactness.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"
#include "services/launcher/local_cluster.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem::testing {

// Starts a cluster of the built binaries (TANDEM_BINARY_DIR/bin) in a fresh run dir.
std::unique_ptr<LocalCluster> StartCluster(int prefill, int decode, int both,
                                           std::vector<std::string> worker_args = {},
                                           std::vector<std::string> router_args = {});
// The same with every option given: bin_dir, log and (when empty) run_dir, a fresh one,
// are filled in; the rest is used as is.
std::unique_ptr<LocalCluster> StartCluster(LocalClusterOptions options);

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<v1::TokenLogprob> logprobs;  // one per token when the request asked for them
  std::string text;
  v1::GenerateResponse final;  // the message carrying finish_reason / usage
  std::string request_id;         // from the messages' request_id field
  std::string header_request_id;  // from the response's initial metadata (x-request-id)
  int messages = 0;
  std::string retry_pushback_ms;  // the grpc-retry-pushback-ms trailer, if any
};

StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request, double timeout_s = 120);
// Every request `copies` times, all at once (result i is request i % reqs.size()'s).
std::vector<StreamResult> GenerateConcurrently(v1::Generation::Stub& stub, const std::vector<v1::GenerateRequest>& reqs,
                                               size_t copies = 1, double timeout_s = 300);
std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address);
// A channel to an internal service of `cluster` (its router's internal address, a
// worker's or a kvstore's gRPC address) with the cluster's client credentials.
std::shared_ptr<grpc::Channel> InternalChannel(const LocalCluster& cluster, const std::string& address);
// tandem.v1.Cluster on the router's internal port, with credentials.
std::unique_ptr<v1::Cluster::Stub> ClusterStub(const LocalCluster& cluster);

// GET http://host:port/path; returns the body ("" on failure).
std::string HttpGet(const std::string& host_port, const std::string& path);
// The same with extra request header lines ("Authorization: Bearer x\r\n"); returns the
// status code (0 on failure) and sets *body.
int HttpGetStatus(const std::string& host_port, const std::string& path, const std::string& extra_headers,
                  std::string* body);

// The model directory every process of a test cluster uses ("tiny", resolved).
std::string TinyModelDir();

// What the engine alone produces for `request` (text prompts tokenized the same way, chat
// prompts formatted with tiny's template): its tokens, text and final metrics.
struct ReferenceOutput {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;  // of each token, when the request asks for logprobs
  RequestMetrics metrics;  // the final output's
  absl::Status status;     // the final output's
};
ReferenceOutput Reference(Engine& engine, const v1::GenerateRequest& request);
// Its tokens alone.
std::vector<int32_t> ReferenceTokens(Engine& engine, const v1::GenerateRequest& request);

v1::GenerateRequest TextRequest(const std::string& text, int max_tokens, std::optional<uint64_t> seed,
                                float temperature);

}  // namespace tandem::testing
