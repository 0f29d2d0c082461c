#include "services/security/token_auth.h"

#include <grpc/grpc_security.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <cstring>
#include <string_view>

#include "services/security/cluster_token.h"
#include "services/security/secret_compare.h"

namespace tandem::security {
namespace {

std::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s)};
}

constexpr char kRefusal[] = "missing or wrong cluster token (x-tandem-cluster-token): this port serves Tandem's "
                            "internal services; see --cluster-token-file";

// C processor: state is the token (a heap std::string owned by the credentials).
void ProcessTokenMetadata(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                          grpc_process_auth_metadata_done_cb done, void* user_data) {
  const std::string& token = *static_cast<const std::string*>(state);
  bool ok = false;
  for (size_t i = 0; i < num_md && !ok; ++i) {
    if (View(md[i].key) == kClusterTokenMetadataKey) ok = ConstantTimeEquals(View(md[i].value), token);
  }
  // Called synchronously: the check is a comparison, nothing that blocks.
  if (ok) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, kRefusal);
  }
}

void DestroyToken(void* state) { delete static_cast<std::string*>(state); }

class TokenServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit TokenServerCredentials(std::string token) : creds_(grpc_insecure_server_credentials_create()) {
    grpc_auth_metadata_processor p{ProcessTokenMetadata, DestroyToken, new std::string(std::move(token))};
    grpc_server_credentials_set_auth_metadata_processor(creds_, p);
  }
  ~TokenServerCredentials() override { grpc_server_credentials_release(creds_); }
  TokenServerCredentials(const TokenServerCredentials&) = delete;
  TokenServerCredentials& operator=(const TokenServerCredentials&) = delete;

  // The token check is the point of these credentials: another processor is a bug.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    GPR_ASSERT(false && "TokenServerCredentials take no other auth metadata processor");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* creds_;
};

// The same check for TLS credentials, through the C++ processor interface.
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*, OutputMetadata*) override {
    auto it = md.find(kClusterTokenMetadataKey);
    if (it != md.end() && ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), token_)) {
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kRefusal);
  }

 private:
  const std::string token_;
};

struct MetadataEntry {
  std::string key, value;
};

class MetadataAdder final : public grpc::experimental::Interceptor {
 public:
  explicit MetadataAdder(std::shared_ptr<const MetadataEntry> entry) : entry_(std::move(entry)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({entry_->key, entry_->value});
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const MetadataEntry> entry_;
};

class MetadataAdderFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  MetadataAdderFactory(std::string key, std::string value)
      : entry_(std::make_shared<const MetadataEntry>(MetadataEntry{std::move(key), std::move(value)})) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new MetadataAdder(entry_);
  }

 private:
  std::shared_ptr<const MetadataEntry> entry_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> TokenCheckingInsecureServerCredentials(std::string token) {
  return std::make_shared<TokenServerCredentials>(std::move(token));
}

void AddTokenCheck(grpc::ServerCredentials& tls_credentials, std::string token) {
  tls_credentials.SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(std::move(token)));
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> TokenInterceptors(
    std::string token) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> v;
  v.push_back(MetadataInterceptor(kClusterTokenMetadataKey, std::move(token)));
  return v;
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> MetadataInterceptor(std::string key,
                                                                                          std::string value) {
  return std::make_unique<MetadataAdderFactory>(std::move(key), std::move(value));
}

}  // namespace tandem::security
