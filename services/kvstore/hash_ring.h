// Consistent hashing of the block-hash key space over kvstore instances (docs/design.md §1:
// "several instances shard the key space"). Each instance, named by a stable instance name
// (not its address, which may change across restarts), owns `vnodes` points on a 64-bit
// ring; a key belongs to the first point at or after it (wrapping). Adding an instance
// moves to it only the keys that now fall before its points (about 1/N of them);
// removing one moves only its own keys, to their next points. Every client with the same
// set of names computes the same owner for every key.
//
// Not thread-safe: clients rebuild a ring when membership changes and read it under
// their own lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::kvstore {

class HashRing {
 public:
  explicit HashRing(int vnodes_per_node = 128);

  // Adds `node` (a no-op when present).
  void Add(const std::string& node);
  // Removes `node` (a no-op when absent).
  void Remove(const std::string& node);

  bool empty() const { return nodes_.empty(); }
  const std::vector<std::string>& nodes() const { return nodes_; }

  // The node owning `key` (a block hash): its index in nodes(). -1 when empty.
  int Owner(uint64_t key) const;
  const std::string& OwnerName(uint64_t key) const { return nodes_[static_cast<size_t>(Owner(key))]; }

 private:
  void Rebuild();

  int vnodes_;
  std::vector<std::string> nodes_;                // sorted
  std::vector<std::pair<uint64_t, int>> points_;  // (ring position, node index), sorted
};

}  // namespace tandem::kvstore
