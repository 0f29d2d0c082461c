// A named file of shared memory mapped read-write by the processes of one machine, and
// the process identities the shared-memory collectives use to tell a dead peer.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::parallel {

// Where a named segment lives: POSIX shared memory "/tandem-<name>" (shm_open, that is
// /dev/shm on Linux) when `directory` is empty, else the file <directory>/tandem-<name>
// (a tmpfs or any file system; the mapping is shared either way).
struct SegmentName {
  std::string name;       // 1 to 200 of [A-Za-z0-9._-]
  std::string directory;  // empty: POSIX shared memory
};

// INVALID_ARGUMENT unless the name is 1 to 200 of [A-Za-z0-9._-].
absl::Status ValidateSegmentName(const SegmentName& name);

// The mapping and its descriptor, released on destruction (the name is not unlinked then:
// UnlinkIfOurs does that, and only the creator calls it).
class SharedSegment {
 public:
  // Unlinks a leftover file of that name (a previous crashed run's), creates a new one of
  // `size` zero bytes (exclusive, mode 0600) and maps it. Errors: INVALID_ARGUMENT for a
  // bad name, INTERNAL (with errno text) for system errors.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(const SegmentName& name, size_t size);
  // Opens and maps the existing file of that name at its current size (which is 0 while
  // its creator has not sized it yet; then nothing is mapped). Errors: NOT_FOUND when
  // there is none (yet), INVALID_ARGUMENT for a bad name, INTERNAL for system errors.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Open(const SegmentName& name);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // "/dev/shm/tandem-<name>" or "<directory>/tandem-<name>", for messages and tests.
  const std::string& path() const { return path_; }

  // Whether the name still names this file: false once it was unlinked, or replaced by
  // the creator of a later group.
  bool NameRefersHere() const;
  // Unlinks the name if it still names this file (never a later group's).
  void UnlinkIfOurs();

 private:
  SharedSegment(const SegmentName& name, std::string path, int fd, dev_t dev, ino_t ino);
  // Opens the name with `flags` (unmapped) and returns the file's current size in *size.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> OpenNamed(const SegmentName& name,
                                                                  int flags, size_t* size);
  absl::Status Map(size_t size);

  SegmentName name_;
  std::string path_;
  int fd_;
  dev_t dev_;
  ino_t ino_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// The path a segment of that name has (what SharedSegment::path() returns).
std::string SegmentPath(const SegmentName& name);

// A process as the group records it: the pid plus the kernel's start time, so that a pid
// reused by another process after the first one died is not taken for the first one.
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot (/proc/<pid>/stat); 0: unknown
};

// The identity of a running process (start_time 0 when /proc cannot tell it).
ProcessIdentity IdentityOf(int32_t pid);
ProcessIdentity SelfIdentity();

// False when the process has exited (a zombie not yet reaped counts as exited: kill(pid, 0)
// alone would call it alive) or its pid now names another process. Reads
// /proc/<pid>/stat; without /proc (start_time 0) it falls back to kill(pid, 0).
bool ProcessAlive(const ProcessIdentity& process);

}  // namespace tandem::parallel
