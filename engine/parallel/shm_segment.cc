#include "engine/parallel/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/common/check.h"

namespace tandem::parallel {
namespace {

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  const int err = errno;
  std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

std::string ShmName(const SegmentName& name) { return absl::StrCat("/tandem-", name.name); }

int OpenName(const SegmentName& name, int flags) {
  if (name.directory.empty()) return ::shm_open(ShmName(name).c_str(), flags | O_CLOEXEC, 0600);
  return ::open(SegmentPath(name).c_str(), flags | O_CLOEXEC, 0600);
}

int UnlinkName(const SegmentName& name) {
  if (name.directory.empty()) return ::shm_unlink(ShmName(name).c_str());
  return ::unlink(SegmentPath(name).c_str());
}

}  // namespace

absl::Status ValidateSegmentName(const SegmentName& name) {
  if (name.name.empty() || name.name.size() > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("a group name has 1 to 200 characters, not ", name.name.size()));
  }
  for (char c : name.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("group name '", name.name, "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

std::string SegmentPath(const SegmentName& name) {
  if (name.directory.empty()) return absl::StrCat("/dev/shm/tandem-", name.name);
  return absl::StrCat(name.directory, "/tandem-", name.name);
}

SharedSegment::SharedSegment(const SegmentName& name, std::string path, int fd, dev_t dev,
                             ino_t ino)
    : name_(name), path_(std::move(path)), fd_(fd), dev_(dev), ino_(ino) {}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) ::munmap(data_, size_);
  ::close(fd_);
}

absl::Status SharedSegment::Map(size_t size) {
  if (size == 0) return absl::OkStatus();
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return ErrnoStatus("cannot map", path_);
  data_ = static_cast<std::byte*>(p);
  size_ = size;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::OpenNamed(const SegmentName& name,
                                                                        int flags, size_t* size) {
  if (absl::Status s = ValidateSegmentName(name); !s.ok()) return s;
  const std::string path = SegmentPath(name);
  const int fd = OpenName(name, flags);
  if (fd < 0) return ErrnoStatus((flags & O_CREAT) != 0 ? "cannot create" : "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    // After a create, the file stays for the next Create to remove.
    absl::Status s = ErrnoStatus("cannot stat", path);
    ::close(fd);
    return s;
  }
  *size = static_cast<size_t>(st.st_size);
  return std::unique_ptr<SharedSegment>(new SharedSegment(name, path, fd, st.st_dev, st.st_ino));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(const SegmentName& name,
                                                                     size_t size) {
  if (absl::Status s = ValidateSegmentName(name); !s.ok()) return s;
  // A leftover of a crashed run: its processes are gone or hold their own mapping, which
  // unlinking does not disturb.
  if (UnlinkName(name) != 0 && errno != ENOENT) {
    return ErrnoStatus("cannot remove stale", SegmentPath(name));
  }
  size_t ignored = 0;
  absl::StatusOr<std::unique_ptr<SharedSegment>> seg =
      OpenNamed(name, O_RDWR | O_CREAT | O_EXCL, &ignored);
  if (!seg.ok()) return seg.status();
  absl::Status s;
  if (::ftruncate((*seg)->fd_, static_cast<off_t>(size)) != 0) {
    s = ErrnoStatus("cannot size", (*seg)->path_);
  } else {
    s = (*seg)->Map(size);
  }
  if (!s.ok()) {
    (*seg)->UnlinkIfOurs();
    return s;
  }
  return seg;
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(const SegmentName& name) {
  size_t size = 0;
  absl::StatusOr<std::unique_ptr<SharedSegment>> seg = OpenNamed(name, O_RDWR, &size);
  if (!seg.ok()) return seg.status();
  if (absl::Status s = (*seg)->Map(size); !s.ok()) return s;
  return seg;
}

bool SharedSegment::NameRefersHere() const {
  const int fd = OpenName(name_, O_RDONLY);
  if (fd < 0) return false;
  struct stat st;
  const bool same = ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
  ::close(fd);
  return same;
}

void SharedSegment::UnlinkIfOurs() {
  // A later group's creator may replace the name between the check and the unlink; it
  // unlinks leftovers itself and creates exclusively, so the window costs it one retry of
  // its joiners at worst, never a wrong group.
  if (NameRefersHere()) UnlinkName(name_);
}

namespace {

// Fields 3 (state) and 22 (start time) of /proc/<pid>/stat; false if unreadable.
bool ReadProcStat(int32_t pid, char* state, uint64_t* start_time) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may hold spaces and ')'.
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr) return false;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3, so field 22 is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_time);
}

}  // namespace

ProcessIdentity IdentityOf(int32_t pid) {
  ProcessIdentity id;
  id.pid = pid;
  char state = 0;
  if (!ReadProcStat(id.pid, &state, &id.start_time)) id.start_time = 0;
  return id;
}

ProcessIdentity SelfIdentity() { return IdentityOf(static_cast<int32_t>(::getpid())); }

bool ProcessAlive(const ProcessIdentity& process) {
  TANDEM_CHECK(process.pid > 0) << "pid " << process.pid;
  if (process.start_time == 0) {
    return ::kill(process.pid, 0) == 0 || errno == EPERM;
  }
  char state = 0;
  uint64_t start = 0;
  if (!ReadProcStat(process.pid, &state, &start)) return false;
  // Z: exited, not yet reaped by its parent; X: being reaped.
  return state != 'Z' && state != 'X' && start == process.start_time;
}

}  // namespace tandem::parallel
