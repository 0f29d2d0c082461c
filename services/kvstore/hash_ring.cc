#include "services/kvstore/hash_ring.h"

#include <algorithm>

#include "kernels/common/check.h"
#include "xxhash.h"

namespace tandem::kvstore {
namespace {

// Block hashes are XXH3 values already; one more mix keeps the key positions independent
// of how the points were made.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

HashRing::HashRing(int vnodes_per_node) : vnodes_(vnodes_per_node) { TANDEM_CHECK_GE(vnodes_, 1); }

void HashRing::Add(const std::string& node) {
  if (std::find(nodes_.begin(), nodes_.end(), node) != nodes_.end()) return;
  nodes_.push_back(node);
  std::sort(nodes_.begin(), nodes_.end());
  Rebuild();
}

void HashRing::Remove(const std::string& node) {
  auto it = std::find(nodes_.begin(), nodes_.end(), node);
  if (it == nodes_.end()) return;
  nodes_.erase(it);
  Rebuild();
}

void HashRing::Rebuild() {
  points_.clear();
  points_.reserve(nodes_.size() * static_cast<size_t>(vnodes_));
  for (size_t n = 0; n < nodes_.size(); ++n) {
    for (int v = 0; v < vnodes_; ++v) {
      const uint64_t pos = XXH3_64bits_withSeed(nodes_[n].data(), nodes_[n].size(), static_cast<uint64_t>(v));
      points_.emplace_back(pos, static_cast<int>(n));
    }
  }
  // Ties (practically impossible) are broken by node name order, the same everywhere.
  std::sort(points_.begin(), points_.end());
}

int HashRing::Owner(uint64_t key) const {
  if (points_.empty()) return -1;
  const uint64_t pos = Mix(key);
  auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(pos, -1));
  if (it == points_.end()) it = points_.begin();
  return it->second;
}

}  // namespace tandem::kvstore
