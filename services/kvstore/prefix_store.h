// What a prefill replica needs from the kvstore tier, kept small so that the prefill
// service is tested over fakes and runs over the real, sharded client (kvstore_client.h):
//  - Fetch: how long a prefix of a prompt's block hash chain the tier holds, and the KV of
//    the blocks after the ones the replica's own cache has, landed in local memory;
//  - Offload: store newly computed full blocks, in the background.
// Both are asynchronous and never fail a request: any problem (no instance, an instance
// down or slow, no room) yields a shorter or empty result, and the caller recomputes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/prefix_kv.h"

namespace tandem {

class PrefixStore {
 public:
  virtual ~PrefixStore() = default;

  struct FetchRequest {
    std::vector<uint64_t> hashes;  // the prompt's full blocks' hash chain, in order
    int32_t first_block = 0;       // fetch from this block on (earlier ones are cached locally)
    int32_t end_block = 0;         // and before this one (the blocks the engine can import)
    // With a per-sequence state: fetch only a state ending past this many blocks (the
    // replica's own cache has one up to there).
    int32_t min_state_end = 0;
    std::string request_id;        // for the tier's logs (may be empty)
  };
  struct FetchResult {
    // The tier answered (some instance is known and every lookup succeeded). When false,
    // stored_prefix means nothing and nothing should be offloaded either.
    bool available = false;
    // How many leading `hashes` the tier holds (also beyond end_block).
    int32_t stored_prefix = 0;
    // The fetched blocks [first_block, first_block + n), verified; null when none.
    std::shared_ptr<const PrefixKv> prefix;
    // With a per-sequence state: the furthest end in [max(first_block, 1), min(stored_prefix,
    // end_block)] whose state the tier holds (0: none), fetched or not.
    int32_t stored_state_end = 0;
  };
  // Calls `done` exactly once, on any thread (possibly inside the call), within the
  // implementation's time limit.
  virtual void Fetch(FetchRequest request, std::function<void(FetchResult)> done) = 0;

  struct OffloadRequest {
    std::vector<uint64_t> hashes;  // the blocks' hashes
    // Their KV, hashes.size() blocks back to back, each a block image (PrefixKv::blocks;
    // a state's chunks are blocks too), held in floats (block bytes are a multiple of 4).
    std::vector<float> data;
    std::string request_id;  // for the tier's logs (may be empty)
  };
  // Stores the blocks (those the tier lacks) in the background; returns at once. Dropped
  // when too much is already in flight.
  virtual void Offload(OffloadRequest request) = 0;

  // Whether any instance is known now.
  virtual bool available() const = 0;
};

}  // namespace tandem
