#include "services/common/transfer/ucx_peer_address.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::transfer::internal {
namespace {

constexpr std::string_view kMagic = "TUA";
constexpr uint8_t kVersion = 1;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Field 22 of /proc/PID/stat (after the parenthesized command name, which may hold spaces).
uint64_t StartTime(uint32_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // the first field after ')' is field 3 (state)
    if (!(fields >> field)) return 0;
  }
  uint64_t start = 0;
  return absl::SimpleAtoi(field, &start) ? start : 0;
}

void PutUint(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void PutBlob(std::string& out, std::string_view blob, int len_bytes) {
  PutUint(out, blob.size(), len_bytes);
  out.append(blob);
}

bool GetUint(std::string_view& in, int bytes, uint64_t& value) {
  if (in.size() < static_cast<size_t>(bytes)) return false;
  value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  }
  in.remove_prefix(bytes);
  return true;
}

bool GetBlob(std::string_view& in, int len_bytes, std::string& out) {
  uint64_t n = 0;
  if (!GetUint(in, len_bytes, n) || in.size() < n) return false;
  out.assign(in.substr(0, n));
  in.remove_prefix(n);
  return true;
}

}  // namespace

ProcessIdentity ProcessIdentity::Self() {
  ProcessIdentity self;
  self.pid = static_cast<uint32_t>(getpid());
  self.start_time = StartTime(self.pid);
  self.boot_id = ReadFile("/proc/sys/kernel/random/boot_id");
  while (!self.boot_id.empty() && self.boot_id.back() == '\n') self.boot_id.pop_back();
  char ns[PATH_MAX];
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns));
  if (n > 0) self.pid_namespace.assign(ns, n);
  return self;
}

bool ProcessIdentity::CanWatch(const ProcessIdentity& other) const {
  return !boot_id.empty() && boot_id == other.boot_id && !pid_namespace.empty() &&
         pid_namespace == other.pid_namespace && other.pid != 0 && other.start_time != 0;
}

std::string UcxPeerAddress::Encode() const {
  std::string out(kMagic);
  out.push_back(static_cast<char>(kVersion));
  PutUint(out, owner.pid, 4);
  PutUint(out, owner.start_time, 8);
  PutBlob(out, owner.boot_id, 1);
  PutBlob(out, owner.pid_namespace, 1);
  PutBlob(out, worker_address, 4);
  return out;
}

absl::StatusOr<UcxPeerAddress> UcxPeerAddress::Decode(std::string_view bytes) {
  auto invalid = [] {
    return absl::InvalidArgumentError("not the address of a UCX transfer engine");
  };
  if (bytes.size() < kMagic.size() + 1 || bytes.substr(0, kMagic.size()) != kMagic ||
      static_cast<uint8_t>(bytes[kMagic.size()]) != kVersion) {
    return invalid();
  }
  std::string_view in = bytes.substr(kMagic.size() + 1);
  UcxPeerAddress a;
  uint64_t pid = 0;
  if (!GetUint(in, 4, pid) || !GetUint(in, 8, a.owner.start_time) ||
      !GetBlob(in, 1, a.owner.boot_id) || !GetBlob(in, 1, a.owner.pid_namespace) ||
      !GetBlob(in, 4, a.worker_address) || !in.empty() || a.worker_address.empty()) {
    return invalid();
  }
  a.owner.pid = static_cast<uint32_t>(pid);
  return a;
}

absl::StatusOr<int> OpenProcessHandle(const ProcessIdentity& process) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, process.pid, 0));
  if (fd < 0) {
    if (errno == ESRCH) {
      return absl::UnavailableError(absl::StrCat("peer process ", process.pid, " has exited"));
    }
    return absl::InternalError(absl::StrCat("pidfd_open: ", std::strerror(errno)));
  }
  // The pid may have been reused since the address was made: compare start times (read
  // after the pidfd is open, so the pidfd refers to the process checked).
  if (StartTime(process.pid) != process.start_time || ProcessExited(fd)) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("peer process ", process.pid, " has exited"));
  }
  return fd;
}

bool ProcessExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace tandem::transfer::internal
