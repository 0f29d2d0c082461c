// The cluster token on a real gRPC server (in process, loopback): calls without the token
// or with another one end UNAUTHENTICATED before the handler runs; the right one passes.
#include "services/security/token_auth.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>

#include "gtest/gtest.h"
#include "services/security/cluster_token.h"
#include "services/security/internal_credentials.h"

namespace tandem::security {
namespace {

// Answers every method with OK and counts the calls it saw.
class CountingService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    ++calls;
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
  std::atomic<int> calls{0};
};

std::string WriteTemp(const std::string& text) {
  std::string path = ::testing::TempDir() + "/token-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand());
  std::ofstream(path) << text;
  return path;
}

grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request, response;
  grpc::Slice slice(std::string("x"));
  request = grpc::ByteBuffer(&slice, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/tandem.v1.Cluster/Register", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(s); });
  return done.get_future().get();
}

TEST(TokenAuthTest, CallsWithoutTheRightTokenAreRefusedBeforeAnyHandler) {
  const std::string token = "0123456789abcdef0123";
  absl::StatusOr<InternalCredentials> server_creds = InternalCredentials::Load({.cluster_token_file = WriteTemp(token)});
  ASSERT_TRUE(server_creds.ok()) << server_creds.status();
  CountingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", server_creds->ServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  const grpc::Status none = Call(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  absl::StatusOr<InternalCredentials> wrong =
      InternalCredentials::Load({.cluster_token_file = WriteTemp("0123456789abcdef0124\n")});
  ASSERT_TRUE(wrong.ok());
  const grpc::Status bad = Call(wrong->CreateChannel(address));
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::UNAUTHENTICATED) << bad.error_message();
  absl::StatusOr<InternalCredentials> prefix =
      InternalCredentials::Load({.cluster_token_file = WriteTemp(token + "5")});
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(Call(prefix->CreateChannel(address)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(service.calls.load(), 0) << "a handler ran for an unauthenticated call";

  // The right token (the file's content, whitespace around it ignored) passes.
  absl::StatusOr<InternalCredentials> right = InternalCredentials::Load({.cluster_token_file = WriteTemp(" " + token + "\n")});
  ASSERT_TRUE(right.ok());
  const grpc::Status ok = Call(right->CreateChannel(address));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(service.calls.load(), 1);
  server->Shutdown();
}

TEST(TokenAuthTest, TokenFilesAndTlsFlagsAreCheckedWithTheFlagNamed) {
  absl::StatusOr<InternalCredentials> short_token = InternalCredentials::Load({.cluster_token_file = WriteTemp("abc")});
  EXPECT_EQ(short_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_token.status().message().find("--cluster-token-file"), std::string::npos);
  EXPECT_EQ(InternalCredentials::Load({.cluster_token_file = "/nonexistent"}).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<InternalCredentials> partial = InternalCredentials::Load({.tls_cert = "/x.pem"});
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(partial.status().message().find("--tls-key, --tls-ca"), std::string::npos) << partial.status();
  absl::StatusOr<InternalCredentials> not_pem = InternalCredentials::Load(
      {.tls_cert = WriteTemp("hello"), .tls_key = WriteTemp("x"), .tls_ca = WriteTemp("y")});
  EXPECT_EQ(not_pem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_pem.status().message().find("--tls-cert"), std::string::npos);
  EXPECT_FALSE(InternalCredentials().authenticated());
}

}  // namespace
}  // namespace tandem::security
