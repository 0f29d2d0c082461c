// The key of a stored KV block: the layout fingerprint (model, dtype, block size, layout
// version) and the block's hash in the chain of docs/design.md §4. Both are part of every key,
// so blocks of different models or builds never mix even if a hash collided across them.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace tandem::kvstore {

struct BlockKey {
  uint64_t fingerprint = 0;
  uint64_t hash = 0;

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine(std::move(h), k.fingerprint, k.hash);
  }
  std::string ToString() const { return absl::StrFormat("%016x/%016x", fingerprint, hash); }
};

}  // namespace tandem::kvstore
