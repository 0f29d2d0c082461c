// Multi-turn conversation replay against a local cluster, with the kvstore tier off and
// on, in the same run (docs/design.md §11: the reference is measured alongside).
//
// Each conversation starts from its own long context (a document of --history-tokens
// tokens) and runs --turns turns; every turn resends the whole history (document, every
// earlier user message and answer) plus a new user message of --turn-tokens tokens, and
// the answer (--output-tokens, greedy) joins the history. Requests go turn by turn across
// all conversations (turn 1 of every conversation, then turn 2, ...), so a prefill
// replica's own prefix cache, kept small (--prefill-kv-cache-mb), has long forgotten a
// conversation when its next turn comes: what is reused is what the kvstore serves.
//
// Both clusters (kvstore off, kvstore on) run side by side, and every request goes to
// both back to back (which one first alternates): the two modes see the same machine
// load, so the ratio holds on a shared machine too.
//
// Reported per mode (JSON): TTFT percentiles measured at the client (all turns, and the
// repeat turns 2..N), the fraction of repeated prefix tokens served from cache (sum of
// usage.cached_prompt_tokens over the repeated prefix of each repeat turn: the previous
// turn's prompt and answer), the seconds spent in requests, and the kvstore's and the
// prefill replica's /stats; then the ratio p50 TTFT off / on over the repeat turns, and
// whether every answer was identical in both modes.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "nlohmann/json.hpp"
#include "services/launcher/local_cluster.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Args {
  std::string model;
  int conversations = 50;
  int turns = 8;
  int history_tokens = 7680;
  int turn_tokens = 64;
  int output_tokens = 16;
  int vocab_low = 100, vocab_high = 1000;
  int concurrency = 1;
  int threads = 0;
  int64_t prefill_kv_cache_mb = 12;
  std::string kvstore_capacity = "4G";
  std::string modes = "off,on";
  std::string json;
  std::string run_dir;
};

struct Turn {
  int conversation = 0;
  int turn = 0;
  int prompt_tokens = 0;
  int repeated_tokens = 0;  // the prefix this prompt shares with the conversation's previous request
  int cached_tokens = 0;
  double ttft_ms = 0;
  double e2e_ms = 0;
  std::vector<int32_t> answer;
  bool ok = false;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

nlohmann::json Summary(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return {{"count", v.size()},
          {"mean", v.empty() ? 0 : sum / static_cast<double>(v.size())},
          {"p50", Percentile(v, 50)},
          {"p90", Percentile(v, 90)},
          {"p99", Percentile(v, 99)}};
}

// GET http://host:port/path (the admin /stats pages); "" on failure.
std::string HttpGetLocal(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) return "";
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  std::string resp;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

nlohmann::json AdminStats(const LocalCluster& c, const std::string& name) {
  for (const ProcessInfo& p : c.processes()) {
    if (p.name != name) continue;
    nlohmann::json j = nlohmann::json::parse(HttpGetLocal(p.ready.value("admin", ""), "/stats"), nullptr, false);
    return j.is_discarded() ? nlohmann::json() : j;
  }
  return nlohmann::json();
}

Turn RunOne(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt, int output_tokens) {
  Turn t;
  v1::GenerateRequest r;
  for (int32_t x : prompt) r.mutable_token_ids()->add_ids(x);
  r.mutable_sampling()->set_temperature(0.0f);
  r.mutable_stop()->set_max_tokens(output_tokens);
  r.mutable_stop()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub.Generate(&ctx, r);
  v1::GenerateResponse m;
  bool first = true;
  while (reader->Read(&m)) {
    if (first && m.token_ids_size() > 0) {
      t.ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      first = false;
    }
    t.answer.insert(t.answer.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.has_usage()) t.cached_tokens = m.usage().cached_prompt_tokens();
  }
  const grpc::Status s = reader->Finish();
  t.e2e_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  t.ok = s.ok();
  if (!s.ok()) std::fprintf(stderr, "request failed: %s\n", s.error_message().c_str());
  t.prompt_tokens = static_cast<int>(prompt.size());
  return t;
}

// One cluster (kvstore off or on) and the conversations as it answered them.
struct Mode {
  bool kvstore_on = false;
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<v1::Generation::Stub> stub;
  std::vector<std::vector<int32_t>> history;  // per conversation: every prompt and answer so far
  std::vector<int> previous_len;              // per conversation: the last request's prompt + answer
  std::vector<Turn> turns;
};

std::unique_ptr<Mode> StartMode(const Args& a, bool kvstore_on) {
  LocalClusterOptions o;
  o.bin_dir = SelfBinaryDir();
  o.run_dir = (fs::path(a.run_dir) / (kvstore_on ? "kvstore-on" : "kvstore-off")).string();
  o.model = a.model;
  o.num_prefill = 1;
  o.num_decode = 1;
  o.num_kvstore = kvstore_on ? 1 : 0;
  o.kvstore_args = {"--capacity=" + a.kvstore_capacity};
  o.worker_args = {"--threads=" + std::to_string(a.threads), "--max-batch-tokens=2048"};
  o.prefill_args = {"--kv-cache-mb=" + std::to_string(a.prefill_kv_cache_mb)};
  o.router_args = {"--heartbeat-ms=500"};
  o.log = [](const std::string& line) { std::fprintf(stderr, "[cluster] %s\n", line.c_str()); };
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cannot start the cluster: %s\n", std::string(cluster.status().message()).c_str());
    std::exit(1);
  }
  auto m = std::make_unique<Mode>();
  m->kvstore_on = kvstore_on;
  m->cluster = std::move(*cluster);
  m->stub = v1::Generation::NewStub(grpc::CreateChannel(m->cluster->router_address(), grpc::InsecureChannelCredentials()));
  return m;
}

nlohmann::json Report(Mode& m, double seconds) {
  std::vector<double> ttft_all, ttft_repeat, ttft_first;
  int64_t repeated = 0, cached = 0, cached_all = 0, prompt_tokens = 0, failed = 0, history_tokens_repeat = 0;
  int64_t output_tokens = 0;
  for (const Turn& r : m.turns) {
    if (!r.ok) ++failed;
    ttft_all.push_back(r.ttft_ms);
    prompt_tokens += r.prompt_tokens;
    cached_all += r.cached_tokens;
    output_tokens += static_cast<int64_t>(r.answer.size());
    if (r.turn == 1) {
      ttft_first.push_back(r.ttft_ms);
    } else {
      ttft_repeat.push_back(r.ttft_ms);
      repeated += r.repeated_tokens;
      cached += std::min(r.cached_tokens, r.repeated_tokens);
      history_tokens_repeat += r.prompt_tokens;
    }
  }
  nlohmann::json out = {
      {"kvstore", m.kvstore_on},
      {"requests", m.turns.size()},
      {"failed", failed},
      {"busy_seconds", seconds},
      {"prompt_tokens", prompt_tokens},
      {"output_tokens", output_tokens},
      {"mean_prompt_tokens_repeat_turns",
       ttft_repeat.empty() ? 0.0 : static_cast<double>(history_tokens_repeat) / static_cast<double>(ttft_repeat.size())},
      {"ttft_ms_all_turns", Summary(ttft_all)},
      {"ttft_ms_first_turn", Summary(ttft_first)},
      {"ttft_ms_repeat_turns", Summary(ttft_repeat)},
      {"repeated_prefix_tokens", repeated},
      {"repeated_prefix_tokens_cached", cached},
      {"cached_fraction_of_repeated_prefix", repeated > 0 ? static_cast<double>(cached) / static_cast<double>(repeated) : 0.0},
      {"cached_prompt_tokens_all_turns", cached_all},
      {"prefill_stats", AdminStats(*m.cluster, "prefill-0")}};
  if (m.kvstore_on) out["kvstore_stats"] = AdminStats(*m.cluster, "kvstore-0");
  return out;
}

// Runs every conversation turn by turn on every mode's cluster. Each request is sent to
// the modes back to back (which one goes first alternates), so both see the same machine
// load, whatever else runs on it. Returns each mode's busy seconds.
std::vector<double> RunConversations(const Args& a, std::vector<Mode*>& modes) {
  // The conversations' documents and user messages: fixed by the seed, equal in all modes.
  std::vector<std::vector<int32_t>> documents(static_cast<size_t>(a.conversations));
  std::vector<std::vector<std::vector<int32_t>>> users(static_cast<size_t>(a.conversations));
  std::uniform_int_distribution<int32_t> token(a.vocab_low, a.vocab_high - 1);
  for (int c = 0; c < a.conversations; ++c) {
    std::mt19937 rng(static_cast<uint32_t>(1000 + c));
    for (int i = 0; i < a.history_tokens; ++i) documents[static_cast<size_t>(c)].push_back(token(rng));
    for (int t = 0; t < a.turns; ++t) {
      std::vector<int32_t>& u = users[static_cast<size_t>(c)].emplace_back();
      for (int i = 0; i < a.turn_tokens; ++i) u.push_back(token(rng));
    }
  }
  for (Mode* m : modes) {
    m->history = documents;
    m->previous_len.assign(static_cast<size_t>(a.conversations), 0);
  }
  std::vector<double> busy(modes.size(), 0.0);
  std::mutex mu;
  for (int t = 0; t < a.turns; ++t) {
    size_t next = 0;
    auto worker = [&] {
      for (;;) {
        int c;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (next >= static_cast<size_t>(a.conversations)) return;
          c = static_cast<int>(next++);
        }
        const std::vector<int32_t>& u = users[static_cast<size_t>(c)][static_cast<size_t>(t)];
        for (size_t k = 0; k < modes.size(); ++k) {
          const size_t mi = (k + static_cast<size_t>(c + t)) % modes.size();
          Mode& m = *modes[mi];
          std::vector<int32_t> prompt;
          {
            std::lock_guard<std::mutex> lock(mu);
            prompt = m.history[static_cast<size_t>(c)];
          }
          prompt.insert(prompt.end(), u.begin(), u.end());
          Turn r = RunOne(*m.stub, prompt, a.output_tokens);
          r.conversation = c;
          r.turn = t + 1;
          std::lock_guard<std::mutex> lock(mu);
          busy[mi] += r.e2e_ms / 1e3;
          r.repeated_tokens = m.previous_len[static_cast<size_t>(c)];
          std::vector<int32_t>& h = m.history[static_cast<size_t>(c)];
          h = prompt;
          h.insert(h.end(), r.answer.begin(), r.answer.end());
          m.previous_len[static_cast<size_t>(c)] = static_cast<int>(h.size());
          m.turns.push_back(std::move(r));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < std::max(1, a.concurrency); ++i) threads.emplace_back(worker);
    for (auto& th : threads) th.join();
    for (Mode* m : modes) {
      std::vector<double> v;
      for (const Turn& r : m->turns) {
        if (r.turn == t + 1) v.push_back(r.ttft_ms);
      }
      std::fprintf(stderr, "kvstore %s: turn %d/%d done, p50 TTFT %.1f ms\n", m->kvstore_on ? "on" : "off", t + 1,
                   a.turns, Percentile(v, 50));
    }
  }
  // Let the last offloads land before the stats are read.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return busy;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  Args a;
  CLI::App app{"Multi-turn conversation replay with the kvstore tier off and on (bench/README.md)."};
  app.add_option("--model", a.model, "Checkpoint directory (a context of at least history + turns x (turn + output))")
      ->required();
  app.add_option("--conversations", a.conversations)->capture_default_str();
  app.add_option("--turns", a.turns)->capture_default_str();
  app.add_option("--history-tokens", a.history_tokens, "Each conversation's starting context")->capture_default_str();
  app.add_option("--turn-tokens", a.turn_tokens, "Tokens of each new user message")->capture_default_str();
  app.add_option("--output-tokens", a.output_tokens, "Tokens of each answer (greedy)")->capture_default_str();
  app.add_option("--vocab-low", a.vocab_low)->capture_default_str();
  app.add_option("--vocab-high", a.vocab_high)->capture_default_str();
  app.add_option("--concurrency", a.concurrency, "Requests in flight")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads per worker (0 = all)")->capture_default_str();
  app.add_option("--prefill-kv-cache-mb", a.prefill_kv_cache_mb, "The prefill replica's own KV cache")
      ->capture_default_str();
  app.add_option("--kvstore-capacity", a.kvstore_capacity, "The kvstore's DRAM tier")->capture_default_str();
  app.add_option("--modes", a.modes, "off,on | off | on")->capture_default_str();
  app.add_option("--json", a.json, "Write the results here");
  app.add_option("--run-dir", a.run_dir, "Logs and ready files (default: a fresh /tmp directory)");
  CLI11_PARSE(app, argc, argv);
  if (a.run_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-kvstore-bench-XXXXXX").string();
    a.run_dir = ::mkdtemp(tmpl.data());
  }
  nlohmann::json result = {
      {"benchmark", "kvstore_multiturn"},
      {"config",
       {{"model", a.model},
        {"conversations", a.conversations},
        {"turns", a.turns},
        {"history_tokens", a.history_tokens},
        {"turn_tokens", a.turn_tokens},
        {"output_tokens", a.output_tokens},
        {"concurrency", a.concurrency},
        {"threads", a.threads},
        {"prefill_kv_cache_mb", a.prefill_kv_cache_mb},
        {"kvstore_capacity", a.kvstore_capacity}}}};
  std::vector<std::unique_ptr<Mode>> owned;
  std::vector<Mode*> modes;
  for (bool on : {false, true}) {
    if (a.modes.find(on ? "on" : "off") == std::string::npos) continue;
    owned.push_back(StartMode(a, on));
    modes.push_back(owned.back().get());
  }
  const std::vector<double> busy = RunConversations(a, modes);
  std::map<bool, const Mode*> by_mode;
  for (size_t i = 0; i < modes.size(); ++i) {
    result[modes[i]->kvstore_on ? "kvstore_on" : "kvstore_off"] = Report(*modes[i], busy[i]);
    by_mode[modes[i]->kvstore_on] = modes[i];
  }
  if (result.contains("kvstore_on") && result.contains("kvstore_off")) {
    const double off = result["kvstore_off"]["ttft_ms_repeat_turns"]["p50"].get<double>();
    const double on = result["kvstore_on"]["ttft_ms_repeat_turns"]["p50"].get<double>();
    result["p50_ttft_ratio_off_over_on_repeat_turns"] = on > 0 ? off / on : 0.0;
    // Same conversations, greedy: every answer must be identical with the tier on and off.
    std::map<std::pair<int, int>, std::vector<int32_t>> answers;
    for (const Turn& t : by_mode[false]->turns) answers[{t.conversation, t.turn}] = t.answer;
    int64_t differ = 0;
    for (const Turn& t : by_mode[true]->turns) differ += answers[{t.conversation, t.turn}] != t.answer ? 1 : 0;
    result["answers_identical"] = differ == 0;
    result["answers_differing"] = differ;
  }
  for (auto& m : owned) m->cluster->Stop();
  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (!a.json.empty()) std::ofstream(a.json) << text << "\n";
  return 0;
}
