// Disaggregated serving on GPUs with the device-to-device KV path (CUDA IPC): real router,
// prefill and decode processes whose models run on the GPU. On one GPU (two processes
// sharing it) and, when the machine has two, with prefill and decode on different GPUs:
// the output equals an aggregated worker's on the GPU, and the replicas' metrics show the
// KV went GPU to GPU with nothing staged through the host pools or sent over UCX. The
// host path (--kv-transfer transfer) on the GPU gives the same output. A prefill replica
// stopped while it may be writing through the IPC mapping keeps its leases quarantined
// until it resumes (the lease-expiry guarantee on the device-to-device path).
//
// "Equals": the greedy requests' tokens exactly. The sampled requests' tokens too, except
// that they may part where the two runs' next-token distributions agree (their top
// log-probabilities within 2e-3) and the seeded draw fell on the boundary between two
// tokens (within the 2e-3 / (2 T) that such differences can move it): the GPU's sums are
// not bitwise reproducible from run to run (the MoE down projection's float32 atomics, the
// prefill GEMMs' split-K; on the host KV path the logits differ by ~1e-5), so a draw that
// close to a cumulative-probability boundary goes either way. Seen on the H200: request 4
// at its token 26, where two tokens' logits were 9e-4 apart. The comparison is
// tests/integration/sampled_output_match.h (unit-tested). The sampled request is served
// twice: with logprobs (which make every step of it sample on the host, from logits
// copied back) and without (tokens chosen on the GPU, by the prefill replica for the first
// token and the decode replica after it): both are compared with the reference's
// logprobs run, which the GPU's sampler must reproduce up to such boundary draws. Every
// final message's usage counts exactly the tokens streamed.
//
// Skips on machines without a GPU (CI). TANDEM_GPU_TEST_MODEL names the checkpoint
// (default: the built-in tiny model).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "engine/model/model_backend.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/cluster_probes.h"
#include "tests/integration/sampled_output_match.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::MatchOutputs;
using testing::OutputMatch;
using testing::GenerationStub;
using testing::StreamResult;
using testing::TextRequest;

std::string ModelDir() {
  const char* m = std::getenv("TANDEM_GPU_TEST_MODEL");
  return m != nullptr && *m != '\0' ? m : testing::TinyModelDir();
}

// The sum of the samples of metric `name` whose labels include `label` (e.g.
// path="cuda_ipc"; empty: all), from Prometheus text.
double MetricSum(const std::string& text, const std::string& name, const std::string& label = "") {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != '{' && next != ' ') continue;
    const size_t space = line.rfind(' ');
    if (!label.empty() && line.substr(0, space).find(label) == std::string::npos) continue;
    sum += std::strtod(line.c_str() + space + 1, nullptr);
  }
  return sum;
}

std::string MetricsOf(LocalCluster& cluster, const std::string& process) {
  for (const ProcessInfo& p : cluster.processes()) {
    if (p.name == process) return testing::HttpGet(p.ready.value("admin", ""), "/metrics");
  }
  ADD_FAILURE() << "no process " << process;
  return "";
}

std::vector<v1::GenerateRequest> Requests() {
  std::vector<v1::GenerateRequest> out;
  out.push_back(TextRequest("Hello", 24, std::nullopt, 0.0f));
  out.push_back(TextRequest("Prefill on one GPU, decode on another: the KV cache moves GPU to GPU.", 32,
                            std::nullopt, 0.0f));
  std::string long_prompt;
  for (int i = 0; i < 90; ++i) long_prompt += "latent attention block " + std::to_string(i) + ". ";
  out.push_back(TextRequest(long_prompt, 32, std::nullopt, 0.0f));  // several KV blocks
  out.push_back(TextRequest(long_prompt.substr(0, 700), 16, std::nullopt, 0.0f));  // a partial last block
  // top_k within the logprobs listed: the draw at a parting is recomputed from them.
  v1::GenerateRequest sampled = TextRequest("Sampling with a seed gives the same tokens either way", 32, 17, 0.8f);
  sampled.mutable_sampling()->set_top_p(0.9f);
  sampled.mutable_sampling()->set_top_k(20);
  sampled.mutable_sampling()->set_logprobs(20);  // for the comparison where the outputs part
  out.push_back(sampled);
  sampled.mutable_sampling()->set_logprobs(0);  // tokens chosen on the GPU
  out.push_back(sampled);
  return out;
}

// The request whose reference output request i is compared with: the sampled request
// without logprobs against the one with them (same prompt, seed and sampling).
constexpr size_t kSampledOnGpu = 5, kSampledWithLogprobs = 4;
size_t ReferenceOf(size_t i) { return i == kSampledOnGpu ? kSampledWithLogprobs : i; }

using Outputs = std::vector<StreamResult>;

// Whether `got`, the output of request i, equals the reference run's (`want`, every
// request's output) as the header describes (testing::MatchOutputs), and counts its tokens.
OutputMatch SameOutput(size_t i, const StreamResult& got, const Outputs& want) {
  const std::vector<v1::GenerateRequest> requests = Requests();
  const StreamResult& ref = want[ReferenceOf(i)];
  OutputMatch m = MatchOutputs(testing::DrawOf(requests[i]), got.tokens, got.logprobs, ref.tokens, ref.logprobs);
  if (m.same && got.final.usage().completion_tokens() != static_cast<int32_t>(got.tokens.size())) {
    m.same = false;
    m.why = "usage.completion_tokens " + std::to_string(got.final.usage().completion_tokens()) + " for " +
            std::to_string(got.tokens.size()) + " tokens streamed";
  }
  return m;
}

void ExpectSameOutputs(const Outputs& got, const Outputs& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const OutputMatch m = SameOutput(i, got[i], want);
    EXPECT_TRUE(m.same) << "request " << i << " " << m.why;
    if (!m.note.empty()) std::fprintf(stderr, "request %zu %s\n", i, m.note.c_str());
    EXPECT_EQ(got[i].tokens.size(), static_cast<size_t>(Requests()[i].stop().max_tokens())) << "request " << i;
  }
}

class GpuServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }

  // A cluster on the GPU: `prefill_devices` / `decode_devices` place the replicas
  // (decode_devices also the aggregated workers).
  static std::unique_ptr<LocalCluster> Start(int prefill, int decode, int both, std::vector<std::string> prefill_devices,
                                             std::vector<std::string> decode_devices,
                                             std::vector<std::string> worker_args = {}) {
    LocalClusterOptions o;
    o.model = ModelDir();
    o.num_prefill = prefill;
    o.num_decode = decode;
    o.num_both = both;
    o.prefill_devices = std::move(prefill_devices);
    o.decode_devices = std::move(decode_devices);
    // Several processes share a GPU: each takes a slice of its memory.
    o.worker_args = {"--gpu-memory-utilization=0.15", "--kv-cache-mb=256", "--no-kvstore"};
    o.worker_args.insert(o.worker_args.end(), worker_args.begin(), worker_args.end());
    o.router_args = {"--heartbeat-ms=200"};
    return testing::StartCluster(std::move(o));
  }

  static Outputs RunAll(LocalCluster& cluster) {
    auto stub = GenerationStub(cluster.router_address());
    Outputs out;
    for (const v1::GenerateRequest& r : Requests()) {
      StreamResult s = Generate(*stub, r);
      EXPECT_TRUE(s.status.ok()) << s.status.error_message();
      out.push_back(std::move(s));
    }
    return out;
  }

  // The aggregated worker's output on `device`: what every disaggregated run must equal.
  static Outputs Aggregated(const std::string& device) {
    std::unique_ptr<LocalCluster> agg = Start(0, 0, 1, {}, {device});
    if (!agg) return {};
    return RunAll(*agg);
  }

  // The KV of every request went GPU to GPU: the prefill replica counted each request on the
  // cuda_ipc path and none on the transfer path, neither replica copied KV between its GPU
  // and host pools, and nothing went over UCX.
  static void ExpectDeviceToDevice(LocalCluster& cluster, size_t requests) {
    const std::string prefill = MetricsOf(cluster, "prefill-0");
    const std::string decode = MetricsOf(cluster, "decode-0");
    EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"cuda_ipc\""), requests);
    EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"transfer\""), 0);
    EXPECT_GT(MetricSum(prefill, "tandem_kv_transfer_request_bytes_total", "path=\"cuda_ipc\""), 0);
    EXPECT_EQ(MetricSum(prefill, "tandem_kv_host_staging_bytes_total"), 0);
    EXPECT_EQ(MetricSum(decode, "tandem_kv_host_staging_bytes_total"), 0);
    EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_bytes_total"), 0);
    EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_failures_total"), 0);
  }
};

TEST_F(GpuServingTest, OneGpuTwoProcessesMoveKvByCudaIpc) {
  const Outputs want = Aggregated("cuda:0");
  ASSERT_EQ(want.size(), Requests().size());
  // The reference itself: its GPU-sampled request against its logprobs one, every count.
  ExpectSameOutputs(want, want);
  // cuda-ipc: the decode replica must offer its pool (else it does not start) and a request
  // that could not go device to device fails.
  std::unique_ptr<LocalCluster> pd = Start(1, 1, 0, {"cuda:0"}, {"cuda:0"}, {"--kv-transfer=cuda-ipc"});
  ASSERT_NE(pd, nullptr);
  ExpectSameOutputs(RunAll(*pd), want);
  ExpectDeviceToDevice(*pd, want.size());
}

TEST_F(GpuServingTest, TwoGpusMoveKvPeerToPeer) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "one CUDA device: the two-GPU case needs two";
  const Outputs want = Aggregated("cuda:0");
  ASSERT_EQ(want.size(), Requests().size());
  // auto: the path is chosen by the replicas.
  std::unique_ptr<LocalCluster> pd = Start(1, 1, 0, {"cuda:0"}, {"cuda:1"});
  ASSERT_NE(pd, nullptr);
  ExpectSameOutputs(RunAll(*pd), want);
  ExpectDeviceToDevice(*pd, want.size());
}

TEST_F(GpuServingTest, HostPathOnTheGpuGivesTheSameOutput) {
  const Outputs want = Aggregated("cuda:0");
  ASSERT_EQ(want.size(), Requests().size());
  std::unique_ptr<LocalCluster> pd = Start(1, 1, 0, {"cuda:0"}, {"cuda:0"}, {"--kv-transfer=transfer"});
  ASSERT_NE(pd, nullptr);
  ExpectSameOutputs(RunAll(*pd), want);
  const std::string prefill = MetricsOf(*pd, "prefill-0");
  EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"transfer\""), want.size());
  EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"cuda_ipc\""), 0);
  EXPECT_GT(MetricSum(prefill, "tandem_kv_host_staging_bytes_total"), 0);
  EXPECT_GT(MetricSum(MetricsOf(*pd, "decode-0"), "tandem_kv_host_staging_bytes_total"), 0);
}

// A decode replica killed while prefills write into its GPU pool: the prefill replica (whose
// kernels were writing through the IPC mapping) keeps serving without a restart, every
// request completes (retried or migrated to the restarted decode replica), and the new
// replica's pool is used device to device again.
TEST_F(GpuServingTest, DecodeKilledDuringDeviceTransfersLeavesPrefillServing) {
  const Outputs want = Aggregated("cuda:0");
  ASSERT_EQ(want.size(), Requests().size());
  std::unique_ptr<LocalCluster> pd = Start(1, 1, 0, {"cuda:0"}, {"cuda:0"});
  ASSERT_NE(pd, nullptr);
  auto pid_of = [&](const std::string& name) {
    for (const ProcessInfo& p : pd->processes()) {
      if (p.name == name) return p.pid;
    }
    return pid_t{0};
  };
  const pid_t prefill_pid = pid_of("prefill-0");
  const std::vector<v1::GenerateRequest> reqs = Requests();
  std::atomic<int> mismatched{0}, failed{0}, done{0};
  std::vector<std::thread> streams;
  for (int t = 0; t < 4; ++t) {
    streams.emplace_back([&, t] {
      auto stub = GenerationStub(pd->router_address());
      for (int i = 0; i < 10; ++i) {
        const size_t k = static_cast<size_t>(t + i) % reqs.size();
        StreamResult r = Generate(*stub, reqs[k], 180);
        if (!r.status.ok()) {
          ++failed;
          std::fprintf(stderr, "request failed: %s\n", r.status.error_message().c_str());
        } else if (const OutputMatch m = SameOutput(k, r, want); !m.same) {
          ++mismatched;
          std::fprintf(stderr, "request %zu %s\n", k, m.why.c_str());
        }
        ++done;
      }
    });
  }
  while (done < 6) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(pd->Kill("decode-0", SIGKILL).ok());
  for (std::thread& t : streams) t.join();
  EXPECT_EQ(failed, 0);
  // A request the kill caught mid-decode migrates: the new decode replica's KV of the tokens
  // already sent is recomputed by a prefill (one multi-token step, its activations and
  // attention rounded as prefills round them), whose roundings differ from the decode
  // steps' that first computed it, so on the GPU its
  // continuation may part from the undisturbed one (on the CPU it cannot:
  // fault_tolerance_test asserts exactness). At most the 4 requests in flight are affected.
  EXPECT_LE(mismatched, 4);
  std::fprintf(stderr, "requests whose tokens differ from the undisturbed run: %d of 40\n", mismatched.load());
  EXPECT_EQ(pid_of("prefill-0"), prefill_pid) << "the prefill replica died";
  // Afterwards: still device to device, into the restarted replica's pool.
  const std::string before = MetricsOf(*pd, "prefill-0");
  ExpectSameOutputs(RunAll(*pd), want);
  const std::string after = MetricsOf(*pd, "prefill-0");
  EXPECT_EQ(MetricSum(after, "tandem_kv_transfer_requests_total", "path=\"cuda_ipc\"") -
                MetricSum(before, "tandem_kv_transfer_requests_total", "path=\"cuda_ipc\""),
            want.size());
}

// The lease-expiry guarantee on the device-to-device path (fault_tolerance_test has it over
// UCX): a prefill replica stopped (SIGSTOP) while its copies into the decode replica's GPU
// pool may be in flight, for longer than its lease, is dropped by the router and its
// requests retried on the other prefill replica, but the decode replica keeps every lease
// it was recorded writing into quarantined for the whole stop. Resumed while the load goes
// on (the freed blocks are reserved again at once), whatever it still had in hand lands
// nowhere: every request completes with the undisturbed output, KV back to zero, its
// quarantines ended by its own word.
TEST_F(GpuServingTest, AStoppedPrefillsCudaIpcLeasesStayQuarantinedUntilItResumes) {
  constexpr int kLeaseMs = 2000;
  const Outputs want = Aggregated("cuda:0");
  ASSERT_EQ(want.size(), Requests().size());
  std::unique_ptr<LocalCluster> pd = Start(2, 1, 0, {"cuda:0", "cuda:0"}, {"cuda:0"},
                                           {"--kv-transfer=cuda-ipc", "--kv-lease-ms=" + std::to_string(kLeaseMs)});
  ASSERT_NE(pd, nullptr);
  const std::string writer = testing::ProcessNamed(*pd, "prefill-0")->ready.value("grpc", "");
  ASSERT_FALSE(writer.empty());
  auto stub = GenerationStub(pd->router_address());
  // The greedy requests: batched with each other under load, the sampled ones' draws may
  // fall differently where the GPU's sums depend on the batch (the header).
  std::vector<v1::GenerateRequest> reqs = Requests();
  reqs.resize(kSampledWithLogprobs);
  testing::SteadyLoad load(stub.get(), &reqs, 8, 180);
  // A GPU prefill takes milliseconds, so a stop may find prefill-0 between writes: stop it
  // until it is caught holding a lease (quarantined once the lease expired).
  int64_t held = 0;
  int attempts = 0;
  while (held <= 0 && attempts < 20) {
    ++attempts;
    ASSERT_TRUE(pd->Kill("prefill-0", SIGSTOP).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 1000));
    held = testing::QuarantineWritersAt(*pd, "decode-0", writer);
    if (held <= 0) {
      ASSERT_TRUE(pd->Kill("prefill-0", SIGCONT).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // it rejoins the router
    }
  }
  ASSERT_GT(held, 0) << "prefill-0 held no lease on the decode replica in " << attempts << " stops";
  // Three more seconds stopped: its quarantines never shrink, blocks stay quarantined.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int samples = 0;
  while (std::chrono::steady_clock::now() < until) {
    EXPECT_GE(testing::QuarantineWritersAt(*pd, "decode-0", writer), held)
        << "a quarantine of the stopped writer ended while it was stopped";
    EXPECT_GT(testing::Metric(*pd, "decode-0", "tandem_kv_quarantined_blocks"), 0);
    ++samples;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(samples, 10);
  const double ended_before = testing::Metric(*pd, "decode-0", "tandem_kv_quarantine_ends_total", "writer_ended");
  load.Mark();
  ASSERT_TRUE(pd->Kill("prefill-0", SIGCONT).ok());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const std::vector<testing::SteadyLoad::Done> done = load.Stop();
  int after_resume = 0;
  for (const testing::SteadyLoad::Done& d : done) {
    const char* when = d.after_mark ? " (after the resume)" : "";
    EXPECT_TRUE(d.result.status.ok()) << "request " << d.prompt << when << ": " << d.result.status.error_message();
    if (!d.result.status.ok()) continue;
    const OutputMatch m = SameOutput(static_cast<size_t>(d.prompt), d.result, want);
    EXPECT_TRUE(m.same) << "request " << d.prompt << when << " " << m.why;
    after_resume += d.after_mark;
  }
  std::printf("stopped writer on the CUDA IPC path: %zu requests, %d after it resumed, %lld quarantined writes "
              "held (caught on stop %d)\n",
              done.size(), after_resume, static_cast<long long>(held), attempts);
  EXPECT_GT(after_resume, 8);
  testing::ExpectAllKvFree(*pd);
  EXPECT_EQ(testing::QuarantineWritersAt(*pd, "decode-0", writer), 0);
  EXPECT_GT(testing::Metric(*pd, "decode-0", "tandem_kv_quarantine_ends_total", "writer_ended"), ended_before);
  // The KV went device to device.
  const std::string prefill = MetricsOf(*pd, "prefill-0");
  EXPECT_GT(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"cuda_ipc\""), 0);
  EXPECT_EQ(MetricSum(prefill, "tandem_kv_transfer_requests_total", "path=\"transfer\""), 0);
}

}  // namespace
}  // namespace tandem
