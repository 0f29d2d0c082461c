// RemoteMemoryDescriptor: what a peer needs to put bytes into registered memory of another
// process (docs/design.md §5). The decode replica registers its KV pool, hands the descriptor to
// the router (control plane, gRPC), and the prefill replica writes into it (data plane).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::transfer {

struct RemoteMemoryDescriptor {
  // Which TransferEngine kind can reach the memory: "ucx" or "inproc".
  std::string transport;
  // The owning engine's address blob (TransferEngine::address()): binary, opaque.
  std::string engine_address;
  // Remote virtual address of the first byte and the number of bytes described.
  uint64_t base = 0;
  uint64_t length = 0;
  // Packed remote key of the registration (transport-specific, opaque).
  std::string rkey;

  // Versioned binary encoding: magic "TKVD", version, length-prefixed fields, and an
  // XXH3-64 of everything before it (so truncation or corruption in transit is detected
  // before an address blob reaches the transport).
  std::string Serialize() const;
  // INVALID_ARGUMENT for anything that is not a descriptor Serialize() produced (wrong
  // magic, unknown version, truncation, trailing bytes, checksum mismatch, oversized
  // fields, base + length overflowing 64 bits). Never crashes on garbage.
  static absl::StatusOr<RemoteMemoryDescriptor> Parse(std::string_view bytes);

  // The sub-range [offset, offset + length) of this region, same registration.
  // INVALID_ARGUMENT when it does not fit.
  absl::StatusOr<RemoteMemoryDescriptor> Slice(uint64_t offset, uint64_t length) const;

  friend bool operator==(const RemoteMemoryDescriptor&, const RemoteMemoryDescriptor&) = default;
};

}  // namespace tandem::transfer
