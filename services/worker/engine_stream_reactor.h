// A server-streaming RPC fed by an engine OutputStream: writes each output as a
// GenerateResponse, one write in flight at a time (outputs merge in the stream while a
// write is pending, so a slow client never blocks the engine), cancels the engine request
// when the call is cancelled or its deadline passes, and deletes itself when done.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "engine/runtime/engine.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

class EngineStreamReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // Shared with the engine-thread listener (and a pending stream's admission), which may
  // outlive the reactor by a moment.
  struct Shared {
    std::mutex mu;
    EngineStreamReactor* reactor = nullptr;  // null once the RPC is done
    std::atomic<bool> queued{false};         // waiting in the pump queue (.cc)
    Engine* engine = nullptr;
    std::string request_id;
  };

 public:
  // Ends immediately with `error` (not OK).
  static EngineStreamReactor* Failed(const grpc::Status& error);
  // Streams `stream`'s outputs for engine request `request_id`. The first response
  // carries the request id.
  static EngineStreamReactor* Start(Engine* engine, std::string request_id, std::shared_ptr<OutputStream> stream);
  // A stream whose engine request is still being admitted (off the RPC thread): the RPC
  // gets its reactor at once, and Attach or Fail completes it later from any thread,
  // through the handle, which stays valid after the RPC is done (a cancelled call: Attach
  // then cancels the engine request).
  struct Shared;
  using Handle = std::shared_ptr<Shared>;
  static EngineStreamReactor* Pending(Engine* engine, std::string request_id, Handle* handle);
  static void Attach(const Handle& h, std::shared_ptr<OutputStream> stream);
  static void Fail(const Handle& h, const grpc::Status& error);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  EngineStreamReactor() = default;
  friend class PumpQueue;
  void Listen();  // stream_'s pushes pump this reactor (through the pump queue)
  void Pump();  // writes the next pending output if no write is in flight

  Engine* engine_ = nullptr;
  std::string request_id_;
  std::shared_ptr<OutputStream> stream_;
  std::shared_ptr<Shared> shared_;
  std::mutex mu_;
  bool writing_ = false;
  bool final_written_ = false;
  bool finished_ = false;
  bool first_ = true;
  v1::GenerateResponse response_;
};

}  // namespace tandem
