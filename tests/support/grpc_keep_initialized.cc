// Linked into the test binaries that start and drop gRPC servers and channels case after
// case. Debian's gRPC 1.51 runs the callback API's completions on a process-wide queue
// (CallbackAlternativeCQ) that it shuts down when its last user goes away and starts
// again for the next; a case that drops its last server and channel while the next one
// starts can then abort in the old queue's thread ("nexting_thread":
// grpc_cq_internal_unref, "assertion failed: prior > 0"; about 1 run in 100 of
// services_kvstore_client_test). The binaries hold their server for their whole life, so
// only tests meet this. Here gRPC is initialized once and one channel that has made a
// callback call (which takes a reference to that queue) is held for the whole run; it
// is never destroyed, so the queue is never shut down before exit. Not for binaries
// under ThreadSanitizer: the call runs through Debian's uninstrumented gRPC, whose
// synchronization TSAN cannot see (scripts/tsan.sh).
#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace {

class HoldGrpcUp final : public ::testing::Environment {
 public:
  void SetUp() override {
    grpc_init();
    // Never freed: reachable from this object for the whole run (so not a leak to
    // LeakSanitizer), and destroying them at exit is what must not happen.
    channel_ = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel("127.0.0.1:9", grpc::InsecureChannelCredentials()));
    stub_ = new grpc::GenericStub(*channel_);
    context_ = new grpc::ClientContext;
    context_->set_deadline(std::chrono::system_clock::now());
    grpc::Slice empty(std::string{});
    request_ = new grpc::ByteBuffer(&empty, 1);
    response_ = new grpc::ByteBuffer;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    stub_->UnaryCall(context_, "/tandem.test.Hold/Up", grpc::StubOptions(), request_, response_,
                     [&](grpc::Status) {
                       std::lock_guard<std::mutex> lock(mu);
                       done = true;
                       cv.notify_all();
                     });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }

 private:
  std::shared_ptr<grpc::Channel>* channel_ = nullptr;
  grpc::GenericStub* stub_ = nullptr;
  grpc::ClientContext* context_ = nullptr;
  grpc::ByteBuffer* request_ = nullptr;
  grpc::ByteBuffer* response_ = nullptr;
};

::testing::Environment* const kHoldGrpcUp = ::testing::AddGlobalTestEnvironment(new HoldGrpcUp);

}  // namespace
