#include "services/common/transfer/remote_memory_descriptor.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "services/common/transfer/checksum.h"

namespace tandem::transfer {
namespace {

// Layout (all integers little-endian):
//   "TKVD" | u8 version | u16 n + transport | u32 n + engine_address | u64 base |
//   u64 length | u32 n + rkey | u64 XXH3-64 of every byte before it
constexpr std::string_view kMagic = "TKVD";
constexpr uint8_t kVersion = 1;
constexpr uint64_t kChecksumSeed = 0x544b5644;  // "TKVD"
constexpr size_t kMaxTransport = 64;
constexpr size_t kMaxBlob = 1 << 16;  // worker addresses and rkeys are a few hundred bytes

void PutUint(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  bool ReadUint(int bytes, uint64_t& value) {
    if (bytes_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    value = 0;
    for (int i = 0; i < bytes; ++i) {
      value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    }
    pos_ += bytes;
    return true;
  }

  // A field of `len_bytes` length prefix and at most `max` bytes.
  bool ReadBlob(int len_bytes, size_t max, std::string& out) {
    uint64_t n = 0;
    if (!ReadUint(len_bytes, n) || n > max || bytes_.size() - pos_ < n) return false;
    out.assign(bytes_.substr(pos_, n));
    pos_ += n;
    return true;
  }

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Invalid(std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a KV transfer memory descriptor: ", std::string(why)));
}

}  // namespace

std::string RemoteMemoryDescriptor::Serialize() const {
  std::string out(kMagic);
  out.push_back(static_cast<char>(kVersion));
  PutUint(out, transport.size(), 2);
  out += transport;
  PutUint(out, engine_address.size(), 4);
  out += engine_address;
  PutUint(out, base, 8);
  PutUint(out, length, 8);
  PutUint(out, rkey.size(), 4);
  out += rkey;
  PutUint(out, Checksum(out.data(), out.size(), kChecksumSeed), 8);
  return out;
}

absl::StatusOr<RemoteMemoryDescriptor> RemoteMemoryDescriptor::Parse(std::string_view bytes) {
  if (bytes.size() < kMagic.size() + 1 || bytes.substr(0, kMagic.size()) != kMagic) {
    return Invalid("bad magic");
  }
  const auto version = static_cast<uint8_t>(bytes[kMagic.size()]);
  if (version != kVersion) {
    return Invalid(absl::StrCat("unsupported version ", version, " (this build reads ",
                                kVersion, ")"));
  }
  Reader reader(bytes.substr(kMagic.size() + 1));
  RemoteMemoryDescriptor d;
  uint64_t checksum = 0;
  if (!reader.ReadBlob(2, kMaxTransport, d.transport) ||
      !reader.ReadBlob(4, kMaxBlob, d.engine_address) || !reader.ReadUint(8, d.base) ||
      !reader.ReadUint(8, d.length) || !reader.ReadBlob(4, kMaxBlob, d.rkey)) {
    return Invalid("truncated or oversized field");
  }
  const size_t covered = kMagic.size() + 1 + reader.pos();
  if (!reader.ReadUint(8, checksum)) return Invalid("truncated checksum");
  if (reader.remaining() != 0) return Invalid("trailing bytes");
  if (checksum != Checksum(bytes.data(), covered, kChecksumSeed)) {
    return Invalid("checksum mismatch");
  }
  if (d.transport.empty() || d.engine_address.empty()) {
    return Invalid("empty transport or engine address");
  }
  if (d.length > std::numeric_limits<uint64_t>::max() - d.base) {
    return Invalid("base + length overflows");
  }
  return d;
}

absl::StatusOr<RemoteMemoryDescriptor> RemoteMemoryDescriptor::Slice(uint64_t offset,
                                                                     uint64_t slice_length) const {
  if (offset > length || slice_length > length - offset) {
    return absl::InvalidArgumentError(absl::StrCat("slice [", offset, ", +", slice_length,
                                                   ") outside a region of ", length, " bytes"));
  }
  RemoteMemoryDescriptor slice = *this;
  slice.base = base + offset;
  slice.length = slice_length;
  return slice;
}

}  // namespace tandem::transfer
