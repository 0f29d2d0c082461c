#include "tests/unit/services/transfer/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace tandem::transfer::testing {
namespace {

std::string PeerBinary() {
  if (const char* env = std::getenv("TANDEM_TRANSFER_TEST_PEER"); env != nullptr && *env) {
    return env;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? n : 0);
  return path.substr(0, path.rfind('/') + 1) + "transfer_test_peer";
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Spawn(size_t bytes,
                                                                bool register_memory) {
  signal(SIGPIPE, SIG_IGN);  // a dead peer must fail a write, not kill the test
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  const std::string binary = PeerBinary();
  const std::string size = absl::StrCat(bytes);
  const std::string flag = "--register";
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>(size.c_str()),
                  register_memory ? const_cast<char*>(flag.c_str()) : nullptr, nullptr};
  std::unique_ptr<PeerProcess> peer(new PeerProcess());
  int rc = posix_spawn(&peer->pid_, binary.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  peer->to_child_ = in_pipe[1];
  peer->from_child_ = out_pipe[0];
  if (rc != 0) {
    peer->dead_ = true;
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(rc)));
  }
  absl::StatusOr<std::string> line = peer->ReadLine(absl::Seconds(30));
  if (!line.ok()) return line.status();
  const std::string hex = line->rfind("DESC ", 0) == 0 ? line->substr(5) : "";
  if (hex.empty() || hex.size() % 2 != 0 ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InternalError(absl::StrCat("unexpected first line from the peer: ", *line));
  }
  absl::StatusOr<RemoteMemoryDescriptor> d =
      RemoteMemoryDescriptor::Parse(absl::HexStringToBytes(hex));
  if (!d.ok()) return d.status();
  peer->descriptor_ = *std::move(d);
  return peer;
}

PeerProcess::~PeerProcess() {
  if (!dead_ && pid_ > 0) {
    kill(pid_, SIGCONT);
    (void)WriteLine("QUIT");
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
}

void PeerProcess::Signal(int signal) {
  if (dead_) return;
  kill(pid_, signal);
  if (signal == SIGKILL) {
    int status = 0;
    waitpid(pid_, &status, 0);
    dead_ = true;
  }
}

absl::Status PeerProcess::WriteLine(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(to_child_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("peer pipe: ", std::strerror(errno)));
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PeerProcess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (size_t eol = pending_.find('\n'); eol != std::string::npos) {
      std::string line = pending_.substr(0, eol);
      pending_.erase(0, eol + 1);
      constexpr std::string_view kPrefix = "TPEER ";
      if (line.rfind(kPrefix, 0) == 0) return line.substr(kPrefix.size());
      std::fprintf(stderr, "[peer %d] %s\n", static_cast<int>(pid_), line.c_str());  // UCX logs
      continue;
    }
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("peer did not answer in time");
    pollfd p{from_child_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (rc < 0 && errno != EINTR) return absl::InternalError("poll on the peer pipe failed");
    if (rc <= 0) continue;
    char buf[4096];
    ssize_t n = read(from_child_, buf, sizeof(buf));
    if (n == 0) return absl::UnavailableError("peer closed its pipe (exited?)");
    if (n < 0 && errno != EINTR) return absl::InternalError("read from the peer pipe failed");
    if (n > 0) pending_.append(buf, n);
  }
}

absl::StatusOr<std::string> PeerProcess::Verify(uint64_t seed, const std::vector<Range>& ranges) {
  absl::Status s = WriteLine("VERIFY " + EncodeRanges(seed, ranges));
  if (!s.ok()) return s;
  absl::StatusOr<std::string> line = ReadLine(absl::Seconds(60));
  if (!line.ok()) return line.status();
  if (*line == "OK") return std::string();
  return *line;
}

absl::Status PeerProcess::Clear() {
  absl::Status s = WriteLine("CLEAR");
  if (!s.ok()) return s;
  absl::StatusOr<std::string> line = ReadLine(absl::Seconds(30));
  if (!line.ok()) return line.status();
  return *line == "OK" ? absl::OkStatus() : absl::InternalError(*line);
}

}  // namespace tandem::transfer::testing
