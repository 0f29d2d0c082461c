#include "engine/util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  const int err = errno;
  std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = ErrnoStatus("cannot stat", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const std::byte* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      absl::Status s = ErrnoStatus("cannot mmap", path);
      ::close(fd);
      return s;
    }
    data = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    errno = errno ? errno : ENOENT;
    return ErrnoStatus("cannot read", path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("error reading '", path, "'"));
  return ss.str();
}

absl::Status WriteStringToFile(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return ErrnoStatus("cannot create", tmp);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) return ErrnoStatus("cannot write", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("cannot rename to", path);
  return absl::OkStatus();
}

}  // namespace tandem
