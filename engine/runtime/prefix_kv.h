// Prefix KV computed elsewhere (fetched from the kvstore tier, docs/design.md §3 step 4), handed
// to the engine with a request so that it copies those blocks into its cache instead of
// computing them.
//
// The caller fetches before Submit (the engine thread never waits on the network); the
// engine, when it admits the request, first takes what its own prefix cache holds, then
// allocates blocks for the imported ones that follow, copies their KV in, publishes them
// in its prefix cache like computed blocks, and computes only the rest. Imported tokens
// count as cached (RequestMetrics::cached_prompt_tokens, and imported_prompt_tokens).
// Nothing about the output changes: the KV is the same bytes the model would compute.
//
// When the import cannot be used as given (the local cache lost blocks in front of
// first_block since the caller looked, or no blocks are free), the engine simply
// computes those positions: an import is an offer, never a requirement.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace tandem {

struct PrefixKv {
  // Index (in the prompt, from 0) of the first imported block. Blocks before it are
  // expected in the engine's own prefix cache (the caller asked with
  // Engine::CachedPrefixLength).
  int32_t first_block = 0;
  // The imported blocks' hashes (block_hash.h), i.e. the prompt's chain values from
  // first_block on; Submit checks them against the prompt.
  std::vector<uint64_t> hashes;
  // blocks[i]: the KV of block first_block + i, its block image (KvPool::BlockImage):
  // for one latent stream num_layers x block_size x entry_dim floats, layer-major
  // ([layer][slot][entry]). Read on the engine thread when the request is admitted;
  // `owner` keeps them (and `state`) valid. The engine drops its reference once it copied
  // them (or when the request ends), on its thread: owner's destructor must be quick and
  // thread-safe.
  std::vector<const float*> blocks;
  std::shared_ptr<const void> owner;

  // A layout with per-sequence streams (rings, states: DeepSeek-V4) needs them where the
  // import ends, which is where the prefix may end (the last of `hashes`, or first_block
  // when only the state is imported): `state`'s pieces, concatenated, are that state's
  // image (KvPool::StateImage); `state_hash` is the chain value of the block ending
  // there (prefix_states.h). Empty for one latent stream.
  std::vector<std::span<const std::byte>> state;
  uint64_t state_hash = 0;

  int32_t end_block() const { return first_block + static_cast<int32_t>(hashes.size()); }
};

}  // namespace tandem
