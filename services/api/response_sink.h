// Where a request's answer goes: the transport-neutral side of a client connection
// (request_core.h drives it). The gRPC server stream is one implementation
// (services/router/grpc_generate_reactor.h); an HTTP front end is another, streaming
// (each Write an event) or not (Writes merged into one body at the final one).
//
// Messages are tandem.v1.GenerateResponse: the router's canonical form of a reply
// (token ids, text delta, logprobs; the final one finish reason, usage and timing),
// which the decode replicas already speak; another front end converts at its edge.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

class ResponseSink {
 public:
  virtual ~ResponseSink() = default;

  // Once, before any other call: the request's id (for a header such as x-request-id).
  virtual void Begin(const std::string& request_id) = 0;

  // The next message, in order. The first carries the request id and the first token;
  // the one with `final` also finish reason, matched stop, usage and timing. Returns
  // whether the sink can take another message now: when false the core reads nothing
  // more from downstream until the transport calls RequestCore::OnSinkReady (the sink
  // still accepts a final message or a Fail).
  virtual bool Write(v1::GenerateResponse message, bool final) = 0;

  // Ends the request with an error; never after a final Write. `retry_after`, for
  // refusals (RESOURCE_EXHAUSTED), is the pause a client should take before retrying.
  virtual void Fail(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) = 0;

  // After a final Write or Fail the core makes no further call: the sink may go away
  // then (the transport ends the call once its last write is out).
};

}  // namespace tandem
