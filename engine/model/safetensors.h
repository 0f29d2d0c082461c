// The safetensors format: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the tensor bytes.
//
// Reading maps the file and validates everything before any tensor is used: header
// length, JSON, dtypes, shapes, offsets within the file, sizes equal to shape x dtype,
// no overlaps. A bad file is an INVALID_ARGUMENT / DATA_LOSS error naming the file and
// the tensor, never a crash or an out-of-bounds read.
#pragma once

#include <cstdio>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/tensor.h"
#include "engine/util/mapped_file.h"

namespace tandem {

// Which stored element types a reader accepts: the floating-point weight types F32, BF16,
// F16 and F8_E4M3 (all a V2/V3 checkpoint holds; anything else is an error), or also the
// scale, packed and index types of DeepSeek-V4 checkpoints (F8_E8M0, I8, U8, I32, I64).
enum class AcceptedDTypes { kFloatWeights, kAll };

class SafetensorsFile {
 public:
  // Errors: NOT_FOUND (no file), DATA_LOSS (truncated: the header or a tensor's bytes lie
  // past the end of the file), INVALID_ARGUMENT (malformed header, unsupported dtype,
  // inconsistent shape and size, overlapping tensors).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path, AcceptedDTypes accepted = AcceptedDTypes::kFloatWeights);

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory. Tensors are written back to back in the order
// added; the header is padded with spaces so the data section starts 8-aligned, as the
// reference writer does. Readers must not assume a tensor's bytes are aligned.
class SafetensorsWriter {
 public:
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // `bytes` must hold exactly numel(shape) * DTypeSize(dtype) bytes (checked).
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::vector<std::byte> bytes);
  size_t num_tensors() const { return entries_.size(); }
  // The whole file's contents.
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file whose tensors are known up front but produced one at a time,
// so a checkpoint larger than memory can be written: the header goes first, then each
// tensor's bytes in the declared order. The file appears under its name only after
// Finish() succeeds (it is written to path.tmp until then).
class SafetensorsStreamWriter {
 public:
  struct TensorSpec {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t num_bytes() const;
  };
  // Errors: file system errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Create(
      const std::string& path, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();
  // The bytes of the next tensor, exactly its size (checked).
  absl::Status Append(std::span<const std::byte> bytes);
  // Errors: INTERNAL if tensors are missing; file system errors.
  absl::Status Finish();

 private:
  SafetensorsStreamWriter() = default;
  std::string path_;
  std::vector<TensorSpec> tensors_;
  size_t next_ = 0;
  std::FILE* file_ = nullptr;
};

// The header bytes (8-byte length + padded JSON) of a file holding `tensors` in order.
std::string SafetensorsHeader(const std::vector<SafetensorsStreamWriter::TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace tandem
