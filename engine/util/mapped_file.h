// A read-only memory mapping of a whole file, unmapped on destruction.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class MappedFile {
 public:
  // Errors: NOT_FOUND if the file does not exist, FAILED_PRECONDITION if it is not a
  // regular file, INTERNAL for other system errors (with errno text).
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const std::byte* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::byte* data_;
  size_t size_;
};

// Reads a whole (small) file into a string.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes a file atomically: to path.tmp, then renamed over path.
absl::Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace tandem
