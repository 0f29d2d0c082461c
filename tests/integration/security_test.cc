// Who may talk to a cluster of the real binaries (router + prefill + decode on loopback,
// certificates made here with openssl): the public port never serves tandem.v1.Cluster;
// internal ports refuse clients without the cluster's credentials (mutual TLS or the
// cluster token), a Decode.Release included; API keys on the public API (missing, wrong,
// over its rate) and on the admin pages that show replicas; Debian's python3-grpcio over
// TLS with a key; and the startup refusal of unauthenticated non-loopback internal ports.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/runtime/kv_layout.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/launcher/throwaway_pki.h"
#include "services/security/public_credentials.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/subprocess.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::StreamResult;
using testing::TextRequest;

constexpr char kGoodKey[] = "good-key-0123456789abcdef";
constexpr char kSlowKey[] = "slow-key-0123456789abcdef";

std::chrono::system_clock::time_point Soon() { return std::chrono::system_clock::now() + std::chrono::seconds(15); }

grpc::Status ListReplicas(const std::shared_ptr<grpc::Channel>& channel, v1::ListReplicasResponse* out = nullptr) {
  v1::ListReplicasResponse ignored;
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  return v1::Cluster::NewStub(channel)->ListReplicas(&ctx, v1::ListReplicasRequest(), out ? out : &ignored);
}

grpc::Status RegisterFake(const std::shared_ptr<grpc::Channel>& channel, std::string* id = nullptr) {
  v1::RegisterRequest r;
  r.set_role(v1::ROLE_DECODE);
  r.set_grpc_address("127.0.0.1:9");
  r.set_model("tiny");
  r.set_layout_fingerprint(LayoutFingerprint(*KvLayoutForModel(testing::TinyModelDir())));
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  grpc::Status s = v1::Cluster::NewStub(channel)->Register(&ctx, r, &resp);
  if (id != nullptr) *id = resp.replica_id();
  return s;
}

grpc::Status Release(const std::shared_ptr<grpc::Channel>& channel) {
  v1::ReleaseRequest r;
  r.set_request_id("someone-elses-request");
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Soon());
  return v1::Decode::NewStub(channel)->Release(&ctx, r, &resp);
}

std::shared_ptr<grpc::Channel> Plaintext(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// TLS that verifies the server against `ca` and presents `cert`/`key` (none when empty).
std::shared_ptr<grpc::Channel> Tls(const std::string& address, const std::string& ca, const std::string& cert = "",
                                   const std::string& key = "") {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = read(ca);
  if (!cert.empty()) {
    o.pem_cert_chain = read(cert);
    o.pem_private_key = read(key);
  }
  return grpc::CreateChannel(address, grpc::SslCredentials(o));
}

std::string ProcessAddress(const LocalCluster& c, const std::string& name, const std::string& field) {
  for (const ProcessInfo& p : c.processes()) {
    if (p.name == name) return p.ready.value(field, "");
  }
  return "";
}

// A refusal at the transport (no or a foreign client certificate: the TLS handshake
// fails) or by the server (UNAUTHENTICATED).
void ExpectRefused(const grpc::Status& s, const std::string& what) {
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      << what << ": " << s.error_code() << " " << s.error_message();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    keys_dir_ = new std::string(::testing::TempDir() + "/security-test-keys-" + std::to_string(::getpid()));
    std::filesystem::create_directories(*keys_dir_);
    std::ofstream(*keys_dir_ + "/keys") << "# test keys\n"
                                        << kGoodKey << " name=good\n"
                                        << kSlowKey << " name=slow rps=0.001 burst=1\n";
    LocalClusterOptions o;
    o.num_prefill = 1;
    o.num_decode = 1;
    o.worker_args = {"--threads=1"};
    o.router_args = {"--heartbeat-ms=200", "--api-keys-file=" + *keys_dir_ + "/keys", "--http-listen=127.0.0.1:0"};
    o.internal_auth = LocalClusterOptions::InternalAuth::kMutualTls;
    o.public_tls = true;
    cluster_ = testing::StartCluster(std::move(o)).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    std::filesystem::remove_all(*keys_dir_);
    delete keys_dir_;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  // The public port over TLS (verified against the throwaway CA).
  std::shared_ptr<grpc::Channel> Public() const {
    return Tls(cluster_->router_address(), cluster_->pki()->ca_cert());
  }

  static LocalCluster* cluster_;
  static std::string* keys_dir_;
};

LocalCluster* SecurityTest::cluster_ = nullptr;
std::string* SecurityTest::keys_dir_ = nullptr;

TEST_F(SecurityTest, ThePublicPortDoesNotServeTheClusterService) {
  EXPECT_EQ(ListReplicas(Public()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(RegisterFake(Public()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // Even with the cluster's own client certificate: the service is simply not there.
  const ThrowawayPki& pki = *cluster_->pki();
  EXPECT_EQ(RegisterFake(Tls(cluster_->router_address(), pki.ca_cert(), pki.client_cert(), pki.client_key()))
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, TheInternalPortRequiresAClientCertificateOfTheClusterCa) {
  const std::string internal = cluster_->router_internal_address();
  ASSERT_FALSE(internal.empty());
  ASSERT_NE(internal, cluster_->router_address());
  const ThrowawayPki& pki = *cluster_->pki();
  ExpectRefused(RegisterFake(Plaintext(internal)), "plaintext");
  ExpectRefused(RegisterFake(Tls(internal, pki.ca_cert())), "TLS without a client certificate");
  absl::StatusOr<std::unique_ptr<ThrowawayPki>> other = ThrowawayPki::Create();
  ASSERT_TRUE(other.ok()) << other.status();
  ExpectRefused(RegisterFake(Tls(internal, pki.ca_cert(), (*other)->client_cert(), (*other)->client_key())),
                "a certificate of another CA");
  // Nothing was registered by those attempts.
  v1::ListReplicasResponse list;
  ASSERT_TRUE(ListReplicas(testing::InternalChannel(*cluster_, internal), &list).ok());
  EXPECT_EQ(list.replicas_size(), 2);
  // The right certificate registers (and deregisters) a replica.
  std::string id;
  auto right = Tls(internal, pki.ca_cert(), pki.client_cert(), pki.client_key());
  const grpc::Status s = RegisterFake(right, &id);
  EXPECT_TRUE(s.ok()) << s.error_message();
  grpc::ClientContext ctx;
  v1::DeregisterRequest d;
  d.set_replica_id(id);
  v1::DeregisterResponse dr;
  EXPECT_TRUE(v1::Cluster::NewStub(right)->Deregister(&ctx, d, &dr).ok());
}

TEST_F(SecurityTest, WorkersRefuseUnauthenticatedInternalCallsSuchAsDecodeRelease) {
  const std::string decode = ProcessAddress(*cluster_, "decode-0", "grpc");
  ASSERT_FALSE(decode.empty());
  const ThrowawayPki& pki = *cluster_->pki();
  ExpectRefused(Release(Plaintext(decode)), "Release over plaintext");
  ExpectRefused(Release(Tls(decode, pki.ca_cert())), "Release without a client certificate");
  // With the credentials the call reaches the service (an unknown id is no error).
  const grpc::Status s = Release(testing::InternalChannel(*cluster_, decode));
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
}

TEST_F(SecurityTest, ApiKeysMissingWrongRightAndOverTheRate) {
  auto stub = v1::Generation::NewStub(Public());
  auto generate = [&](const std::string& key) {
    StreamResult r;
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon() + std::chrono::seconds(60));
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    auto reader = stub->Generate(&ctx, TextRequest("Who may talk to the router", 6, std::nullopt, 0.0f));
    v1::GenerateResponse m;
    while (reader->Read(&m)) r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    r.status = reader->Finish();
    const auto& trailers = ctx.GetServerTrailingMetadata();
    if (auto it = trailers.find("grpc-retry-pushback-ms"); it != trailers.end()) {
      r.retry_pushback_ms.assign(it->second.data(), it->second.size());
    }
    return r;
  };
  EXPECT_EQ(generate("").status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(generate("not-a-key-0123456789").status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const StreamResult good = generate(kGoodKey);
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.tokens.size(), 6u);
  // Unary methods are checked too.
  {
    grpc::ClientContext ctx;
    v1::ListModelsResponse models;
    EXPECT_EQ(stub->ListModels(&ctx, v1::ListModelsRequest(), &models).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // The slow key: one request, then over its rate (0.001/s: the next token in 1000 s).
  const StreamResult first = generate(kSlowKey);
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  const StreamResult second = generate(kSlowKey);
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.status.error_message();
  EXPECT_TRUE(second.tokens.empty());
  ASSERT_FALSE(second.retry_pushback_ms.empty()) << "no grpc-retry-pushback-ms trailer";
  EXPECT_GT(std::stoll(second.retry_pushback_ms), 900000);
  EXPECT_LE(std::stoll(second.retry_pushback_ms), 1000000);
}

TEST_F(SecurityTest, AdminPagesThatShowReplicasNeedTheKeyMetricsAndHealthDoNot) {
  std::string admin;
  for (const ProcessInfo& p : cluster_->processes()) {
    if (p.role == "router") admin = p.ready.value("admin", "");
  }
  ASSERT_FALSE(admin.empty());
  std::string body;
  for (const char* path : {"/replicas", "/api/summary"}) {
    EXPECT_EQ(testing::HttpGetStatus(admin, path, "", &body), 401) << path << ": " << body;
    EXPECT_EQ(body.find("127.0.0.1"), std::string::npos) << path << " leaked addresses: " << body;
    EXPECT_EQ(testing::HttpGetStatus(admin, path, "Authorization: Bearer wrong-key-0123456789\r\n", &body), 401);
    EXPECT_EQ(testing::HttpGetStatus(admin, path, std::string("Authorization: Bearer ") + kGoodKey + "\r\n", &body),
              200)
        << path;
  }
  EXPECT_NE(body.find("{"), std::string::npos);
  for (const char* path : {"/metrics", "/healthz", "/readyz"}) {
    EXPECT_EQ(testing::HttpGetStatus(admin, path, "", &body), 200) << path;
  }
}

TEST_F(SecurityTest, PythonGrpcClientGeneratesOverTlsWithAnApiKey) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  const std::string script = std::string(src) + "/tests/integration/python_client.py";
  const std::string stubs = std::string(bin) + "/python";
  auto r = testing::RunProcess({"/usr/bin/python3", script, "--addr", cluster_->router_address(), "--stubs", stubs,
                                "--tls-ca", cluster_->pki()->ca_cert(), "--api-key", kGoodKey});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("finish_reason=FINISH_REASON_LENGTH tokens=8"), std::string::npos) << r.out << r.err;
  // Without the key it is refused.
  auto refused = testing::RunProcess({"/usr/bin/python3", script, "--addr", cluster_->router_address(), "--stubs",
                                      stubs, "--tls-ca", cluster_->pki()->ca_cert()});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("UNAUTHENTICATED"), std::string::npos) << refused.err;
}

// With --public-tls-cert the HTTP API is HTTPS with the same certificate: the official
// OpenAI Node SDK (trusting the throwaway CA) lists models, completes and streams, a
// wrong key is 401; without the CA its TLS stack refuses the server; plain HTTP to that
// port gets no HTTP answer, and the port still serves HTTPS after it.
TEST_F(SecurityTest, TheHttpApiIsHttpsWithThePublicCertificate) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string http = cluster_->router_http_address();
  ASSERT_FALSE(http.empty());
  const std::string script = std::string(src) + "/tests/integration/openai/https_client.mjs";
  const std::string url = "https://" + http + "/v1";

  std::string body;
  EXPECT_EQ(testing::HttpGetStatus(http, "/health", "", &body), 0) << "plain HTTP was answered: " << body;

  auto trusted = testing::RunProcess({"/usr/bin/env", "node", script, url, "tiny", kGoodKey, "trusted"},
                                     {"NODE_EXTRA_CA_CERTS=" + cluster_->pki()->ca_cert()}, 300);
  std::fprintf(stderr, "%s", trusted.err.c_str());
  ASSERT_EQ(trusted.exit_code, 0) << trusted.out << trusted.err;
  const nlohmann::json got = nlohmann::json::parse(trusted.out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << trusted.out;
  EXPECT_GE(got.value("chat_completion_tokens", 0), 1);
  EXPECT_GE(got.value("stream_chunks", 0), 2);
  EXPECT_EQ(got.value("wrong_key_status", 0), 401);

  auto untrusted = testing::RunProcess({"/usr/bin/env", "node", script, url, "tiny", kGoodKey, "untrusted"}, {}, 120);
  EXPECT_EQ(untrusted.exit_code, 0) << untrusted.out << untrusted.err;
}

// The cluster token instead of mutual TLS (tcp-only setups).
TEST(SecurityTokenTest, WrongOrMissingTokensAreUnauthenticatedAndTheClusterServes) {
  LocalClusterOptions o;
  o.num_prefill = 1;
  o.num_decode = 1;
  o.worker_args = {"--threads=1"};
  o.router_args = {"--heartbeat-ms=200"};
  o.internal_auth = LocalClusterOptions::InternalAuth::kToken;
  auto cluster = testing::StartCluster(std::move(o));
  ASSERT_NE(cluster, nullptr);
  const std::string internal = cluster->router_internal_address();
  const std::string decode = ProcessAddress(*cluster, "decode-0", "grpc");
  auto with_token = [](const std::string& token, const std::string& address) {
    const std::string path = ::testing::TempDir() + "/wrong-token-" + std::to_string(::getpid());
    std::ofstream(path) << token;
    absl::StatusOr<security::InternalCredentials> c = security::InternalCredentials::Load({.cluster_token_file = path});
    EXPECT_TRUE(c.ok()) << c.status();
    return c->CreateChannel(address);
  };
  EXPECT_EQ(RegisterFake(Plaintext(internal)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(RegisterFake(with_token("wrong-token-0123456789", internal)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Release(Plaintext(decode)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Release(with_token("wrong-token-0123456789", decode)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::ListReplicasResponse list;
  const grpc::Status s = ListReplicas(testing::InternalChannel(*cluster, internal), &list);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(list.replicas_size(), 2);
  EXPECT_EQ(ListReplicas(Plaintext(cluster->router_address())).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // The processes reach each other with the token: a request goes through.
  auto stub = testing::GenerationStub(cluster->router_address());
  const StreamResult r = Generate(*stub, TextRequest("Tokens between replicas", 5, std::nullopt, 0.0f));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 5u);
}

// Internal ports without credentials may listen on loopback only.
TEST(SecurityStartupTest, UnauthenticatedNonLoopbackInternalPortsAreAStartupError) {
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{testing::BinaryPath("tandem-router"), "--internal-listen", "0.0.0.0:0"},
        std::vector<std::string>{testing::BinaryPath("tandem-decode"), "--listen", "0.0.0.0:0"},
        std::vector<std::string>{testing::BinaryPath("tandem-kvstore"), "--listen", "0.0.0.0:0"}}) {
    auto r = testing::RunProcess(argv, {}, 60);
    EXPECT_NE(r.exit_code, 0) << argv[0];
    for (const char* flag : {"0.0.0.0:0", "--tls-cert", "--cluster-token-file"}) {
      EXPECT_NE((r.out + r.err).find(flag), std::string::npos) << argv[0] << ": " << r.out << r.err;
    }
  }
}

// A TLS key that is not the certificate's is a startup error naming both files (before
// this, gRPC said only that it could not listen), for the public ports and the internal one.
TEST(SecurityStartupTest, ATlsKeyOfAnotherCertificateIsAStartupError) {
  absl::StatusOr<std::unique_ptr<ThrowawayPki>> pki = ThrowawayPki::Create();
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto r = testing::RunProcess({testing::BinaryPath("tandem-router"), "--listen", "127.0.0.1:0", "--internal-listen",
                                "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                                "--model", testing::TinyModelDir(), "--public-tls-cert", (*pki)->node_cert(),
                                "--public-tls-key", (*pki)->client_key()},
                               {}, 60);
  EXPECT_NE(r.exit_code, 0);
  const std::string said = r.out + r.err;
  EXPECT_NE(said.find((*pki)->client_key()), std::string::npos) << said;
  EXPECT_NE(said.find((*pki)->node_cert()), std::string::npos) << said;
  EXPECT_NE(said.find("does not belong"), std::string::npos) << said;
  // The internal port's mutual TLS: the CA's certificate with the node's key.
  auto internal = testing::RunProcess({testing::BinaryPath("tandem-router"), "--listen", "127.0.0.1:0",
                                       "--internal-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--model",
                                       testing::TinyModelDir(), "--tls-cert", (*pki)->ca_cert(), "--tls-key",
                                       (*pki)->node_key(), "--tls-ca", (*pki)->ca_cert()},
                                      {}, 60);
  EXPECT_NE(internal.exit_code, 0);
  EXPECT_NE((internal.out + internal.err).find("--tls-key " + (*pki)->node_key()), std::string::npos)
      << internal.out << internal.err;
}

}  // namespace
}  // namespace tandem
