#include "services/common/ready_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::service {
namespace {

absl::Status ErrnoStatus(int err, std::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(std::string(what), " ", path));
}

}  // namespace

absl::Status WriteReadyFile(const std::string& path, const nlohmann::json& contents) {
  if (path.empty()) return absl::InvalidArgumentError("ready file: empty path");
  const std::string text = contents.dump(2) + "\n";

  // A name unique per process and call, so that concurrent writers never share one.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));

  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "ready file: cannot create", tmp);
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "ready file: cannot write", tmp);
    }
    written += static_cast<size_t>(n);
  }
  int err = ::fsync(fd) == 0 ? 0 : errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "ready file: cannot flush", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "ready file: cannot rename onto", path);
  }
  return absl::OkStatus();
}

}  // namespace tandem::service
