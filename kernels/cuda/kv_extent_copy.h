// Copies a sequence's KV given as byte ranges ("extents") of one pool to the matching
// ranges of another, possibly in another process (a CUDA IPC mapping), and folds what it
// copies into a checksum: the device-to-device KV transfer of models whose KV is not one
// latent stream (DeepSeek-V4: paged compressed streams plus per-sequence rings and
// states; engine/model/kv_pool.h, KvPool::SequenceExtents lists the ranges in the same
// order on both sides). kv_block_copy.h is the same for one latent stream.
//
// The checksum, exactly (all arithmetic on uint64_t, wrapping; Mix and kGolden as in
// kv_block_copy.h): the extents, in list order, are read as one sequence of 8-byte
// little-endian words x[0..W); word g lies in extent e with layer l_e, and
//   sum = sum over g of Mix(x[g] ^ (Mix((l_e << 48) ^ g ^ kGolden) + kGolden))
// Sender and receiver list the same extents (same sizes, same layers, same order), so
// they agree exactly when the bytes agree; a word moved to another place in the sequence
// or another layer changes its salt. KvExtentsChecksum below is the same function on the
// host.
#pragma once

#include <cstddef>
#include <cstdint>
#if __cplusplus >= 202002L
#include <span>
#endif

#include <cuda_runtime.h>

namespace tandem::cuda {

// One range: `bytes` at `src_offset` of the source pool go to `dst_offset` of the
// destination pool. Offsets and lengths are multiples of 8.
struct KvExtentPair {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  int64_t layer = 0;       // in [0, 2^16)
  uint64_t first_word = 0;  // the index of its first word in the sequence (sum of the previous extents' words)
};

struct KvExtentCopyParams {
  const std::byte* src = nullptr;  // source pool base, 8-byte aligned, readable from the current device
  uint64_t src_bytes = 0;          // its length: every source range must lie inside
  std::byte* dst = nullptr;        // destination pool base (an IPC mapping), 8-byte aligned; null: checksum only
  uint64_t dst_bytes = 0;          // its length (as mapped, not as a peer claimed)
  const KvExtentPair* extents = nullptr;  // device memory, `num_extents` pairs
  int64_t num_extents = 0;
  uint64_t total_words = 0;  // the sum of every extent's bytes / 8 (< 2^48)
  unsigned long long* checksum = nullptr;  // device; the words' checksum is added (may be null)
  // Device; set to 1 when an extent is misaligned, has a layer outside [0, 2^16), or lies
  // outside its pool (that extent is neither copied nor summed). May be null.
  int32_t* bad_extent = nullptr;
};

// Launches on `stream`; allocates nothing (capturable in a CUDA graph). Returns
// cudaErrorInvalidValue, launching nothing, for: a null src or extents (with extents),
// bases not 8-byte aligned, num_extents < 0, total_words >= 2^48, dst and checksum both
// null. No extents: succeeds and launches nothing. The pools must not overlap. Extents'
// first_word must be as defined above (the caller fills them; the kernel trusts them only
// for the salts, never for addresses).
cudaError_t KvExtentCopy(const KvExtentCopyParams& p, cudaStream_t stream);

// The host half (kv_extent_copy_host.cc) takes spans; kv_extent_copy.cu is compiled as
// C++17 (CMakeLists.txt), which has none, and sees only the part above.
#if __cplusplus >= 202002L
// Host reference: the checksum of `extents` (their src side) of the pool at `pool`.
uint64_t KvExtentsChecksum(const std::byte* pool, std::span<const KvExtentPair> extents);

// Fills first_word of each pair (a running sum of words in list order) and returns the
// total word count.
uint64_t NumberKvExtentWords(std::span<KvExtentPair> extents);
#endif

}  // namespace tandem::cuda
