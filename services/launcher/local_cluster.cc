#include "services/launcher/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string Tail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_bytes ? s.substr(s.size() - max_bytes) : s;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "stopped";
}

}  // namespace

std::string SelfBinaryDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

void LocalCluster::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterOptions options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster(std::move(options)));
  const LocalClusterOptions& o = c->options_;
  std::error_code ec;
  fs::create_directories(o.run_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.run_dir, ": ", ec.message()));
  for (const char* b : {"tandem-router", "tandem-prefill", "tandem-decode", "tandem-kvstore"}) {
    if (std::string(b) == "tandem-kvstore" && o.num_kvstore == 0) continue;
    if (!fs::exists(fs::path(o.bin_dir) / b, ec)) {
      return absl::NotFoundError(absl::StrCat("cannot find ", b, " in ", o.bin_dir, " (build the services)"));
    }
  }
  if (o.internal_auth != LocalClusterOptions::InternalAuth::kNone || o.public_tls) {
    absl::StatusOr<std::unique_ptr<ThrowawayPki>> pki = ThrowawayPki::Create();
    if (!pki.ok()) return pki.status();
    c->pki_ = std::move(*pki);
    c->Log(absl::StrCat("internal traffic: ",
                        o.internal_auth == LocalClusterOptions::InternalAuth::kMutualTls ? "mutual TLS"
                        : o.internal_auth == LocalClusterOptions::InternalAuth::kToken   ? "cluster token"
                                                                                         : "none",
                        "; throwaway CA and credentials in ", c->pki_->dir()));
  }
  auto make = [&](const std::string& name, const std::string& role, std::vector<std::string> argv) {
    return c->MakeChild(name, role, std::move(argv));
  };
  const std::vector<std::string> auth = c->InternalAuthArgs();
  std::vector<std::string> router = {(fs::path(o.bin_dir) / "tandem-router").string(), "--listen", o.router_listen,
                                     "--internal-listen", o.router_internal_listen, "--model", o.model};
  router.insert(router.end(), auth.begin(), auth.end());
  if (o.public_tls) {
    router.insert(router.end(), {"--public-tls-cert", c->pki_->node_cert(), "--public-tls-key", c->pki_->node_key()});
  }
  router.insert(router.end(), o.router_args.begin(), o.router_args.end());
  c->children_.push_back(make("router", "router", router));
  const auto deadline = std::chrono::steady_clock::now() + o.ready_timeout;
  if (absl::Status s = c->Spawn(c->children_[0]); !s.ok()) return s;
  if (absl::Status s = c->WaitReady(c->children_[0], deadline); !s.ok()) return s;
  const std::string router_address = c->children_[0].info.ready["grpc"].get<std::string>();
  const std::string router_internal = c->children_[0].info.ready.value("internal", "");
  // A restarted router comes back on the same ports, where the workers keep heartbeating
  // (they register again when it does not know them).
  for (size_t i = 0; i + 1 < c->children_[0].argv.size(); ++i) {
    if (c->children_[0].argv[i] == "--listen") c->children_[0].argv[i + 1] = router_address;
    if (c->children_[0].argv[i] == "--internal-listen") c->children_[0].argv[i + 1] = router_internal;
  }
  // kvstores first, so that prefill replicas find them when they register.
  for (int i = 0; i < o.num_kvstore; ++i) {
    const std::string name = absl::StrCat("kvstore-", i);
    std::vector<std::string> argv = {(fs::path(o.bin_dir) / "tandem-kvstore").string(), "--router", router_internal,
                                     "--model", o.model, "--instance-name", name};
    argv.insert(argv.end(), auth.begin(), auth.end());
    if (!o.kvstore_disk_root.empty()) {
      argv.push_back("--disk-dir");
      argv.push_back((fs::path(o.kvstore_disk_root) / name).string());
    }
    argv.insert(argv.end(), o.kvstore_args.begin(), o.kvstore_args.end());
    c->children_.push_back(make(name, "kvstore", argv));
    if (absl::Status s = c->Spawn(c->children_.back()); !s.ok()) return s;
  }
  for (size_t i = 1; i < c->children_.size(); ++i) {
    if (absl::Status s = c->WaitReady(c->children_[i], deadline); !s.ok()) {
      c->Stop(std::chrono::milliseconds(2000));
      return s;
    }
  }
  const size_t first_worker = c->children_.size();
  auto worker = [&](const std::string&, const std::string& role, int i) {
    c->next_index_[role] = i + 1;
    return make(absl::StrCat(role, "-", i), role, c->WorkerArgv(role, i));
  };
  for (int i = 0; i < o.num_prefill; ++i) c->children_.push_back(worker("tandem-prefill", "prefill", i));
  for (int i = 0; i < o.num_decode; ++i) c->children_.push_back(worker("tandem-decode", "decode", i));
  for (int i = 0; i < o.num_both; ++i) c->children_.push_back(worker("tandem-decode", "both", i));
  for (size_t i = first_worker; i < c->children_.size(); ++i) {
    if (absl::Status s = c->Spawn(c->children_[i]); !s.ok()) return s;
  }
  for (size_t i = first_worker; i < c->children_.size(); ++i) {
    if (absl::Status s = c->WaitReady(c->children_[i], deadline); !s.ok()) {
      c->Stop(std::chrono::milliseconds(2000));
      return s;
    }
  }
  if (o.restart) c->supervisor_ = std::thread([raw = c.get()] { raw->Supervise(); });
  return c;
}

LocalCluster::Child LocalCluster::MakeChild(const std::string& name, const std::string& role,
                                           std::vector<std::string> argv) const {
  Child ch;
  ch.info.name = name;
  ch.info.role = role;
  ch.ready_file = (fs::path(options_.run_dir) / (name + ".ready.json")).string();
  ch.log_file = (fs::path(options_.run_dir) / (name + ".log")).string();
  argv.push_back("--ready-file");
  argv.push_back(ch.ready_file);
  ch.argv = std::move(argv);
  return ch;
}

std::vector<std::string> LocalCluster::WorkerArgv(const std::string& role, int index) const {
  const std::string binary = role == "prefill" ? "tandem-prefill" : "tandem-decode";
  const std::string router = children_.empty() ? "" : children_[0].info.ready.value("internal", "");
  std::vector<std::string> argv = {(fs::path(options_.bin_dir) / binary).string(), "--role", role, "--router",
                                   router, "--model", options_.model};
  const std::vector<std::string> auth = InternalAuthArgs();
  argv.insert(argv.end(), auth.begin(), auth.end());
  argv.insert(argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  if (role == "prefill") argv.insert(argv.end(), options_.prefill_args.begin(), options_.prefill_args.end());
  const std::vector<std::string>& devices = role == "prefill" ? options_.prefill_devices : options_.decode_devices;
  if (!devices.empty()) argv.push_back("--device=" + devices[index % devices.size()]);
  return argv;
}

absl::StatusOr<std::string> LocalCluster::AddWorker(const std::string& role, std::vector<std::string> extra_args) {
  Child c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int index = next_index_[role]++;
    std::vector<std::string> argv = WorkerArgv(role, index);
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    c = MakeChild(absl::StrCat(role, "-", index), role, argv);
  }
  if (absl::Status s = Spawn(c); !s.ok()) return s;
  if (absl::Status s = WaitReady(c, std::chrono::steady_clock::now() + options_.ready_timeout); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  children_.push_back(c);
  return c.info.name;
}

absl::StatusOr<int> LocalCluster::StopProcess(const std::string& name, int signal, std::chrono::milliseconds grace) {
  pid_t pid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Child& c : children_) {
      if (c.info.name == name && c.info.pid > 0) {
        c.retired = true;
        pid = c.info.pid;
        c.info.pid = 0;  // the supervisor no longer watches it
      }
    }
  }
  if (pid == 0) return absl::NotFoundError(absl::StrCat("no running process named ", name));
  ::kill(pid, signal);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

absl::Status LocalCluster::Spawn(Child& c) {
  std::error_code ec;
  fs::remove(c.ready_file, ec);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, c.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  // Children must not inherit our blocked SIGINT/SIGTERM: they handle their own.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.insert(env.end(), options_.env.begin(), options_.env.end());
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : c.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", c.argv[0], ": ", std::strerror(rc)));
  c.info.pid = pid;
  c.started = std::chrono::steady_clock::now();
  Log(absl::StrCat("started ", c.info.name, " (pid ", pid, "), log ", c.log_file));
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitReady(Child& c, std::chrono::steady_clock::time_point deadline) {
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(c.info.pid, &status, WNOHANG) == c.info.pid) {
      return absl::UnavailableError(absl::StrCat(c.info.name, " ", DescribeExit(status), " before it was ready; log:\n",
                                                 Tail(c.log_file)));
    }
    std::ifstream in(c.ready_file);
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded()) {
        c.info.ready = std::move(j);
        return absl::OkStatus();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(c.info.name, " was not ready in time; log:\n", Tail(c.log_file)));
}

void LocalCluster::Supervise() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<size_t> dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      for (size_t i = 0; i < children_.size(); ++i) {
        Child& c = children_[i];
        int status = 0;
        if (c.retired || c.info.pid <= 0 || waitpid(c.info.pid, &status, WNOHANG) != c.info.pid) continue;
        if (std::chrono::steady_clock::now() - c.started > std::chrono::seconds(60)) {
          c.backoff = std::chrono::milliseconds(500);
        }
        Log(absl::StrCat(c.info.name, " (pid ", c.info.pid, ") ", DescribeExit(status), "; restarting in ",
                         c.backoff.count(), " ms"));
        c.info.pid = 0;
        dead.push_back(i);
      }
    }
    // Restart outside the lock (backoff and readiness take time; the API stays usable).
    for (size_t i : dead) {
      Child copy;
      {
        std::lock_guard<std::mutex> lock(mu_);
        copy = children_[i];
        children_[i].backoff = std::min(children_[i].backoff * 2, std::chrono::milliseconds(10000));
      }
      std::this_thread::sleep_for(copy.backoff);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_ || children_[i].retired) return;
      }
      if (!Spawn(copy).ok()) continue;
      copy.info.restarts++;
      if (absl::Status s = WaitReady(copy, std::chrono::steady_clock::now() + options_.ready_timeout); !s.ok()) {
        Log(std::string(s.message()));
      }
      std::lock_guard<std::mutex> lock(mu_);
      Child& c = children_[i];
      c.info.pid = copy.info.pid;
      c.info.ready = copy.info.ready;
      c.info.restarts = copy.info.restarts;
      c.started = copy.started;
      if (stopping_ || c.retired) ::kill(copy.info.pid, SIGTERM);
    }
  }
}

std::string LocalCluster::router_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.empty() ? "" : children_[0].info.ready.value("grpc", "");
}

std::string LocalCluster::router_http_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.empty() ? "" : children_[0].info.ready.value("http", "");
}

std::string LocalCluster::router_internal_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.empty() ? "" : children_[0].info.ready.value("internal", "");
}

std::vector<std::string> LocalCluster::InternalAuthArgs() const {
  switch (options_.internal_auth) {
    case LocalClusterOptions::InternalAuth::kMutualTls:
      return {"--tls-cert", pki_->node_cert(), "--tls-key", pki_->node_key(), "--tls-ca", pki_->ca_cert()};
    case LocalClusterOptions::InternalAuth::kToken:
      return {"--cluster-token-file", pki_->token_file()};
    case LocalClusterOptions::InternalAuth::kNone:
      break;
  }
  return {};
}

security::InternalCredentials LocalCluster::ClientCredentials() const {
  security::InternalAuthFlags f;
  if (options_.internal_auth == LocalClusterOptions::InternalAuth::kMutualTls) {
    f = {.tls_cert = pki_->client_cert(), .tls_key = pki_->client_key(), .tls_ca = pki_->ca_cert()};
  } else if (options_.internal_auth == LocalClusterOptions::InternalAuth::kToken) {
    f.cluster_token_file = pki_->token_file();
  }
  absl::StatusOr<security::InternalCredentials> c = security::InternalCredentials::Load(f);
  // The files were made by this object and live as long as it: failing to read them is a bug.
  if (!c.ok()) {
    std::fprintf(stderr, "LocalCluster: %s\n", std::string(c.status().message()).c_str());
    std::abort();
  }
  return *c;
}

std::vector<ProcessInfo> LocalCluster::processes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ProcessInfo> out;
  for (const Child& c : children_) out.push_back(c.info);
  return out;
}

nlohmann::json LocalCluster::ReadyJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json procs = nlohmann::json::array();
  for (const Child& c : children_) {
    nlohmann::json p = c.info.ready;
    p["name"] = c.info.name;
    p["role"] = c.info.role;
    p["pid"] = c.info.pid;
    p["log"] = c.log_file;
    procs.push_back(p);
  }
  nlohmann::json security = {{"internal_auth", options_.internal_auth == LocalClusterOptions::InternalAuth::kMutualTls
                                                    ? "mutual TLS"
                                                : options_.internal_auth == LocalClusterOptions::InternalAuth::kToken
                                                    ? "cluster token"
                                                    : "none"},
                              {"public_tls", options_.public_tls}};
  if (pki_) {
    security["ca"] = pki_->ca_cert();
    if (options_.internal_auth == LocalClusterOptions::InternalAuth::kMutualTls) {
      security["client_cert"] = pki_->client_cert();
      security["client_key"] = pki_->client_key();
    }
    if (options_.internal_auth == LocalClusterOptions::InternalAuth::kToken) security["token_file"] = pki_->token_file();
  }
  return {{"router", children_.empty() ? nlohmann::json() : children_[0].info.ready},
          {"internal", children_.empty() ? std::string() : children_[0].info.ready.value("internal", "")},
          {"security", security},
          {"processes", procs},
          {"run_dir", options_.run_dir}};
}

absl::Status LocalCluster::Kill(const std::string& name, int signal) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Child& c : children_) {
    if (c.info.name == name && c.info.pid > 0) {
      ::kill(c.info.pid, signal);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("no running process named ", name));
}

void LocalCluster::Stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (supervisor_.joinable()) supervisor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // Workers first, so they deregister from a live router; the router last.
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->info.pid > 0) ::kill(it->info.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    Child& c = *it;
    while (c.info.pid > 0) {
      int status = 0;
      const pid_t r = waitpid(c.info.pid, &status, WNOHANG);
      if (r == c.info.pid || r < 0) {
        c.info.pid = 0;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        Log(absl::StrCat(c.info.name, " did not stop in time: SIGKILL"));
        ::kill(c.info.pid, SIGKILL);
        waitpid(c.info.pid, &status, 0);
        c.info.pid = 0;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

LocalCluster::~LocalCluster() { Stop(); }

}  // namespace tandem
