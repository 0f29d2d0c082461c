#include "engine/runtime/block_hash.h"

#include <array>
#include <bit>
#include <type_traits>

#include "kernels/common/check.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace tandem {
namespace {

// Canonical encodings are little-endian regardless of the host.
template <typename T>
void StoreLe(T value, unsigned char* out) {
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<unsigned char>(u & 0xff);
    u = static_cast<U>(u >> 8);
  }
}

void UpdateLe32(XXH3_state_t* state, int32_t value) {
  unsigned char bytes[4];
  StoreLe(value, bytes);
  XXH3_64bits_update(state, bytes, sizeof(bytes));
}

void UpdateString(XXH3_state_t* state, const std::string& s) {
  unsigned char len[4];
  StoreLe(static_cast<uint32_t>(s.size()), len);
  XXH3_64bits_update(state, len, sizeof(len));
  XXH3_64bits_update(state, s.data(), s.size());
}

void UpdateTokens(XXH3_state_t* state, std::span<const int32_t> tokens) {
  if constexpr (std::endian::native == std::endian::little) {
    XXH3_64bits_update(state, tokens.data(), tokens.size_bytes());
  } else {
    std::array<unsigned char, 256> buf;
    size_t used = 0;
    for (int32_t t : tokens) {
      if (used == buf.size()) {
        XXH3_64bits_update(state, buf.data(), used);
        used = 0;
      }
      StoreLe(t, buf.data() + used);
      used += 4;
    }
    XXH3_64bits_update(state, buf.data(), used);
  }
}

}  // namespace

uint64_t LayoutFingerprint(const KvLayout& layout) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  UpdateString(&state, layout.model_id);
  UpdateLe32(&state, layout.block_size);
  UpdateLe32(&state, layout.num_layers);
  UpdateLe32(&state, layout.layout_version);
  UpdateLe32(&state, static_cast<int32_t>(layout.streams.size()));
  for (const KvStream& s : layout.streams) {
    UpdateString(&state, s.name);
    UpdateString(&state, s.dtype);
    UpdateLe32(&state, static_cast<int32_t>(s.granularity));
    UpdateLe32(&state, s.tokens);
    UpdateLe32(&state, s.width);
    UpdateLe32(&state, static_cast<int32_t>(s.layers.size()));
    for (int32_t l : s.layers) UpdateLe32(&state, l);
  }
  return XXH3_64bits_digest(&state);
}

uint64_t HashBlock(uint64_t parent_hash, std::span<const int32_t> block_tokens, uint64_t fingerprint) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  unsigned char header[16];
  StoreLe(parent_hash, header);
  StoreLe(fingerprint, header + 8);
  XXH3_64bits_update(&state, header, sizeof(header));
  UpdateTokens(&state, block_tokens);
  return XXH3_64bits_digest(&state);
}

void ExtendBlockHashes(std::span<const int32_t> tokens, int32_t block_size, uint64_t fingerprint,
                       std::vector<uint64_t>* hashes) {
  TANDEM_CHECK(block_size > 0) << "block_size " << block_size;
  const size_t bs = static_cast<size_t>(block_size);
  const size_t full = tokens.size() / bs;
  TANDEM_CHECK_LE(hashes->size(), full) << "more hashes than full blocks";
  uint64_t parent = hashes->empty() ? kRootBlockParentHash : hashes->back();
  hashes->reserve(full);
  for (size_t b = hashes->size(); b < full; ++b) {
    parent = HashBlock(parent, tokens.subspan(b * bs, bs), fingerprint);
    hashes->push_back(parent);
  }
}

std::vector<uint64_t> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size,
                                     uint64_t fingerprint) {
  std::vector<uint64_t> hashes;
  ExtendBlockHashes(tokens, block_size, fingerprint, &hashes);
  return hashes;
}

uint64_t StateChunkHash(uint64_t block_hash, uint32_t chunk) {
  unsigned char bytes[20];
  StoreLe(block_hash, bytes);
  StoreLe(uint64_t{0x74616e64656d5354ull}, bytes + 8);
  for (int i = 0; i < 4; ++i) bytes[16 + i] = static_cast<unsigned char>(chunk >> (8 * i));
  return XXH3_64bits(bytes, sizeof(bytes));
}

}  // namespace tandem
