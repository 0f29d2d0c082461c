// The KV block hash chain (docs/design.md §4): h_i = XXH3(h_{i-1}, tokens of block i, layout
// fingerprint). Only full blocks get a hash. The same values index the local prefix cache
// (block_manager.h), the kvstore and the router's cache-aware routing table, so they are
// defined on canonical little-endian byte encodings and are stable across processes,
// machines and builds: never change an encoding below without bumping
// KvLayout::layout_version (which changes every fingerprint and so every hash).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model/kv_streams.h"

namespace tandem {

// Everything that decides whether the KV bytes of a block computed by one process can be
// reused by another. Two layouts with equal fields have equal fingerprints.
struct KvLayout {
  std::string model_id;    // e.g. model_type + a hash of config.json + a digest of the weights
  int32_t block_size = 0;  // tokens per block (64 by default)
  int32_t num_layers = 0;
  int32_t layout_version = 0;
  // What every layer keeps (engine/model/kv_streams.h): for DeepSeek-V2/V3 one per-token
  // stream `latent` of 576 values (latent 512 + rope 64) on every layer.
  std::vector<KvStream> streams;
};

// XXH3-64 (seed 0) of the encoding
//   u32 len(model_id) | model_id bytes | i32 block_size | i32 num_layers | i32 layout_version |
//   u32 number of streams | per stream, in order:
//     u32 len(name) | name bytes | u32 len(dtype) | dtype bytes | i32 granularity |
//     i32 tokens | i32 width | u32 number of layers | i32 layer ...
// with every integer little-endian (layout version 2; version 1 had a single dtype and
// entry width in place of the streams).
uint64_t LayoutFingerprint(const KvLayout& layout);

// The parent hash of a sequence's first block ("tandemKV" read as a big-endian u64).
inline constexpr uint64_t kRootBlockParentHash = 0x74616e64656d4b56ull;

// The hash of one block: XXH3-64 (seed 0) of
//   u64 parent_hash | u64 fingerprint | i32 token[0] | ... | i32 token[n-1]
// little-endian. `block_tokens` is the whole (full) block; its length is not encoded
// separately because the fingerprint covers the block size.
uint64_t HashBlock(uint64_t parent_hash, std::span<const int32_t> block_tokens, uint64_t fingerprint);

// One hash per full block of `tokens`, chained from kRootBlockParentHash; a trailing
// partial block gets none. block_size must be positive (checked).
std::vector<uint64_t> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size,
                                     uint64_t fingerprint);

// Incremental form for a growing sequence: appends to *hashes the hashes of the full
// blocks of `tokens` beyond the first hashes->size() (which must be the chain of those
// blocks, as made by an earlier call on a prefix of `tokens`). A no-op until another block
// is full. block_size must be positive and hashes->size() at most the full block count.
void ExtendBlockHashes(std::span<const int32_t> tokens, int32_t block_size, uint64_t fingerprint,
                       std::vector<uint64_t>* hashes);

// The name of chunk `chunk` of the state snapshot taken where block `block_hash` ends
// (prefix_states.h), for a store of fixed-size blocks that keeps a state longer than a
// block in several (the kvstore tier): XXH3-64 (seed 0) of
//   u64 block_hash | u64 "tandemST" (big-endian) | u32 chunk
// little-endian. It covers what the block's hash covers, so it names one state only.
uint64_t StateChunkHash(uint64_t block_hash, uint32_t chunk);

}  // namespace tandem
