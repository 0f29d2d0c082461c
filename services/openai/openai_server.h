// The OpenAI-compatible HTTP API of the router (--http-listen): GET /v1/models,
// POST /v1/completions, POST /v1/chat/completions, GET /health, POST /tokenize,
// POST /detokenize, over services/http (transport) and the router core gRPC uses
// (completion_call.h), with the same API keys (Authorization: Bearer KEY).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_info.h"
#include "services/http/http_server.h"
#include "services/openai/completion_call.h"
#include "services/security/api_key_authenticator.h"

namespace tandem::openai {

struct OpenAiServerOptions {
  http::ServerOptions http;
  ParseLimits limits;
};

class OpenAiServer {
 public:
  // `keys` may be null (the API is open); it, the router core and the tokenizer in
  // `context` must outlive the server.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(const std::string& host_port,
                                                             const OpenAiServerOptions& options,
                                                             CompletionContext context, const ModelInfo* config,
                                                             security::ApiKeyAuthenticator* keys);
  ~OpenAiServer();
  std::string bound_address() const { return server_->bound_address(); }
  void Stop();

 private:
  OpenAiServer(const OpenAiServerOptions& options, CompletionContext context, const ModelInfo* config,
               security::ApiKeyAuthenticator* keys)
      : options_(options), context_(std::move(context)), config_(config), keys_(keys) {}
  void Handle(http::Request&& request, std::shared_ptr<http::Exchange> exchange);

  const OpenAiServerOptions options_;
  const CompletionContext context_;
  const ModelInfo* const config_;
  security::ApiKeyAuthenticator* const keys_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace tandem::openai
