#include "tests/integration/cluster_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "engine/model/model_resolver.h"
#include "gtest/gtest.h"
#include "services/api/proto_convert.h"
#include "services/common/host_port.h"

namespace tandem::testing {

std::unique_ptr<LocalCluster> StartCluster(int prefill, int decode, int both, std::vector<std::string> worker_args,
                                           std::vector<std::string> router_args) {
  LocalClusterOptions o;
  o.num_prefill = prefill;
  o.num_decode = decode;
  o.num_both = both;
  worker_args.push_back("--threads=1");
  o.worker_args = worker_args;
  // Fast beats so load reports are fresh; five may be missed (1 s) so that a replica
  // starved by the tests running beside it on a small CI machine is not dropped.
  router_args.push_back("--heartbeat-ms=200");
  router_args.push_back("--missed-heartbeats=5");
  o.router_args = router_args;
  return StartCluster(std::move(o));
}

std::unique_ptr<LocalCluster> StartCluster(LocalClusterOptions o) {
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  o.bin_dir = std::string(bin != nullptr ? bin : ".") + "/bin";
  if (o.run_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-cluster-XXXXXX").string();
    o.run_dir = ::mkdtemp(tmpl.data());
  }
  o.log = [](const std::string& line) { std::fprintf(stderr, "[cluster] %s\n", line.c_str()); };
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  // Registration completes before a process writes its ready file: the router lists every
  // process once Start returns.
  return std::move(*c);
}

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address) {
  return v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::shared_ptr<grpc::Channel> InternalChannel(const LocalCluster& cluster, const std::string& address) {
  return cluster.ClientCredentials().CreateChannel(address);
}

std::unique_ptr<v1::Cluster::Stub> ClusterStub(const LocalCluster& cluster) {
  return v1::Cluster::NewStub(InternalChannel(cluster, cluster.router_internal_address()));
}

StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request, double timeout_s) {
  StreamResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ++r.messages;
    if (!m.request_id().empty()) r.request_id = m.request_id();
    r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    r.logprobs.insert(r.logprobs.end(), m.logprobs().begin(), m.logprobs().end());
    r.text += m.text();
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED || m.has_usage()) r.final = m;
  }
  r.status = reader->Finish();
  const auto& initial = ctx.GetServerInitialMetadata();
  if (auto it = initial.find("x-request-id"); it != initial.end()) {
    r.header_request_id.assign(it->second.data(), it->second.size());
  }
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find("grpc-retry-pushback-ms"); it != trailers.end()) {
    r.retry_pushback_ms = std::string(it->second.data(), it->second.size());
  }
  return r;
}

std::vector<StreamResult> GenerateConcurrently(v1::Generation::Stub& stub, const std::vector<v1::GenerateRequest>& reqs,
                                               size_t copies, double timeout_s) {
  std::vector<StreamResult> got(copies * reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(stub, reqs[i % reqs.size()], timeout_s); });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

std::string HttpGet(const std::string& host_port, const std::string& path) {
  std::string body;
  return HttpGetStatus(host_port, path, "", &body) == 0 ? "" : body;
}

int HttpGetStatus(const std::string& host_port, const std::string& path, const std::string& extra_headers,
                  std::string* body_out) {
  body_out->clear();
  absl::StatusOr<service::HostPort> hp = service::ParseHostPort(host_port);
  if (!hp.ok()) return 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(hp->port);
  ::inet_pton(AF_INET, hp->host == "localhost" ? "127.0.0.1" : hp->host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return 0;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_headers + "\r\n";
  ::send(fd, req.data(), req.size(), 0);
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  int status = 0;
  if (body == std::string::npos || std::sscanf(resp.c_str(), "HTTP/1.%*d %d", &status) != 1) return 0;
  *body_out = resp.substr(body + 4);
  return status;
}

std::string TinyModelDir() {
  absl::StatusOr<std::string> d = ResolveModelDir("tiny");
  EXPECT_TRUE(d.ok()) << d.status();
  return d.value_or("");
}

v1::GenerateRequest TextRequest(const std::string& text, int max_tokens, std::optional<uint64_t> seed,
                                float temperature) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_sampling()->set_temperature(temperature);
  if (seed) r.mutable_sampling()->set_seed(*seed);
  r.mutable_stop()->set_max_tokens(max_tokens);
  r.mutable_stop()->set_ignore_eos(true);
  return r;
}

ReferenceOutput Reference(Engine& engine, const v1::GenerateRequest& r) {
  static std::atomic<int> counter{0};
  // The tiny model's chat template, as the router formats chat prompts with it.
  static const std::unique_ptr<ModelChatTemplates> templates = *LoadChatTemplates(TinyModelDir());
  ReferenceOutput out;
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(r, engine.tokenizer(), engine.config().vocab_size, kDefaultMaxPromptBytes, templates.get());
  EXPECT_TRUE(prompt.ok()) << prompt.status();
  absl::StatusOr<SamplingParams> sampling = FromProto(r.sampling(), engine.config().vocab_size);
  absl::StatusOr<StopParams> stop = FromProto(r.stop(), engine.config().vocab_size);
  absl::StatusOr<OutputConstraint> constraint = FromProto(r.constraint());
  EXPECT_TRUE(constraint.ok()) << constraint.status();
  if (!prompt.ok() || !sampling.ok() || !stop.ok()) {
    out.status = absl::InvalidArgumentError("the reference request is invalid");
    return out;
  }
  EngineRequest req{.id = "ref-" + std::to_string(counter++), .prompt = *prompt, .sampling = *sampling, .stop = *stop};
  if (constraint.ok()) req.constraint = *constraint;
  auto stream = engine.Submit(std::move(req));
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) {
    out.status = stream.status();
    return out;
  }
  RequestOutput o;
  while ((*stream)->Next(&o)) {
    out.tokens.insert(out.tokens.end(), o.token_ids.begin(), o.token_ids.end());
    out.text += o.text;
    for (const TokenLogprobs& l : o.logprobs) out.logprobs.push_back(l.logprob);
    if (o.finished) {
      out.metrics = o.metrics;
      out.status = o.status;
    }
  }
  return out;
}

std::vector<int32_t> ReferenceTokens(Engine& engine, const v1::GenerateRequest& r) { return Reference(engine, r).tokens; }

}  // namespace tandem::testing
