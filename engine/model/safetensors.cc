#include "engine/model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "nlohmann/json.hpp"

namespace tandem {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

absl::StatusOr<DType> ParseDType(const std::string& s, const std::string& tensor,
                                 const std::string& path, AcceptedDTypes accepted) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (accepted == AcceptedDTypes::kAll) {
    if (s == "F8_E8M0") return DType::kF8E8M0;
    if (s == "I8") return DType::kI8;
    if (s == "U8") return DType::kU8;
    if (s == "I32") return DType::kI32;
    if (s == "I64") return DType::kI64;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": tensor '", tensor, "' has dtype '", s, "', which Tandem does not support (supported: F32, BF16, F16, F8_E4M3",
      accepted == AcceptedDTypes::kAll ? ", F8_E8M0, I8, U8, I32, I64)" : ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path,
                                                                       AcceptedDTypes accepted) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(mapped)));
  const std::span<const std::byte> all = file->file_->bytes();
  if (all.size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": file is ", all.size(),
                                            " bytes, too short for a safetensors header"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(all[i]);
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " is not plausible (corrupt file?)"));
  }
  if (header_len > all.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header of ", header_len,
                                            " bytes runs past the end of the file (",
                                            all.size(), " bytes): truncated?"));
  }
  const char* header_begin = reinterpret_cast<const char*>(all.data() + 8);
  nlohmann::json header =
      nlohmann::json::parse(header_begin, header_begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const std::span<const std::byte> data = all.subspan(8 + header_len);

  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
      }
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": __metadata__ value of '", m.key(), "' is not a string"));
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(path, ": tensor '", name, "'");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " needs 'dtype', 'shape' and 'data_offsets'"));
    }
    if (!entry["dtype"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'dtype' is not a string"));
    }
    ASSIGN_OR_RETURN(DType dtype, ParseDType(entry["dtype"].get<std::string>(), name, path, accepted));
    const nlohmann::json& shape_json = entry["shape"];
    if (!shape_json.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": 'shape' is not an array"));
    }
    TensorView view;
    view.dtype = dtype;
    uint64_t numel = 1;
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": shape ", shape_json.dump(), " has a non-integer or negative dimension"));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / dim) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": shape ", shape_json.dump(), " overflows"));
      }
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": 'data_offsets' must be two non-negative integers"));
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                                     "] are reversed"));
    }
    const uint64_t expected = numel * DTypeSize(dtype);
    if (end - begin != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape ", ShapeString(view.shape), " of ", std::string(DTypeName(dtype)), " needs ", expected,
          " bytes but data_offsets [", begin, ", ", end, "] hold ", end - begin));
    }
    if (end > data.size()) {
      return absl::DataLossError(absl::StrCat(where, ": bytes [", begin, ", ", end,
                                              ") lie past the end of the data (", data.size(),
                                              " bytes): truncated file?"));
    }
    view.bytes = data.subspan(begin, end - begin);
    ranges.push_back({begin, end, name});
    file->tensors_.emplace(name, std::move(view));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensors '", ranges[i - 1].name,
                                                     "' and '", ranges[i].name, "' overlap"));
    }
  }
  return file;
}

void SafetensorsWriter::Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<std::byte> bytes) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  TANDEM_CHECK_EQ(static_cast<size_t>(numel) * DTypeSize(dtype), bytes.size()) << name;
  entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

std::string SafetensorsHeader(const std::vector<SafetensorsStreamWriter::TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.num_bytes()}}};
    offset += t.num_bytes();
  }
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  std::string out;
  const uint64_t len = header_text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += header_text;
  return out;
}

uint64_t SafetensorsStreamWriter::TensorSpec::num_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string SafetensorsWriter::Serialize() const {
  std::vector<SafetensorsStreamWriter::TensorSpec> specs;
  uint64_t total = 0;
  for (const Entry& e : entries_) {
    specs.push_back({e.name, e.dtype, e.shape});
    total += e.bytes.size();
  }
  std::string out = SafetensorsHeader(specs, metadata_);
  out.reserve(out.size() + total);
  for (const Entry& e : entries_) out.append(reinterpret_cast<const char*>(e.bytes.data()), e.bytes.size());
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::Create(
    const std::string& path, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->path_ = path;
  w->tensors_ = std::move(tensors);
  w->file_ = std::fopen((path + ".tmp").c_str(), "wb");
  if (w->file_ == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create '", path, ".tmp': ", std::strerror(errno)));
  }
  const std::string header = SafetensorsHeader(w->tensors_, metadata);
  if (std::fwrite(header.data(), 1, header.size(), w->file_) != header.size()) {
    return absl::InternalError(absl::StrCat("cannot write '", path, ".tmp': ", std::strerror(errno)));
  }
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove((path_ + ".tmp").c_str());
  }
}

absl::Status SafetensorsStreamWriter::Append(std::span<const std::byte> bytes) {
  TANDEM_CHECK_LT(next_, tensors_.size()) << "more tensors appended than declared";
  TANDEM_CHECK_EQ(bytes.size(), tensors_[next_].num_bytes()) << tensors_[next_].name;
  ++next_;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::InternalError(absl::StrCat("cannot write '", path_, ".tmp': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (next_ != tensors_.size()) {
    return absl::InternalError(absl::StrCat(path_, ": ", tensors_.size() - next_, " declared tensors never written"));
  }
  const bool ok = std::fflush(file_) == 0;
  std::fclose(file_);
  file_ = nullptr;
  if (!ok || std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot finish '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Serialize());
}

}  // namespace tandem
