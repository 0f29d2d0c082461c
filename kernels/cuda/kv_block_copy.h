// Copies a sequence's latent KV entries from one paged pool to another, possibly in
// another process or on another GPU (a CUDA IPC mapping with peer access), and folds what
// it copies into a checksum: the device-to-device KV transfer between a prefill and a
// decode replica on one host (docs/design.md §5). Both pools have the layout
// [layer][block][block_size slots][entry_bytes]; each side has its own block table.
//
// The checksum is order-independent (a sum over entries), so the sender can compute it
// layer by layer while copying and the receiver over its blocks in one pass; it depends on
// each entry's bytes, its layer and its position, so a misplaced block or a swapped layer
// shows. KvEntryChecksum below is the same function on the host (tests, references).
//
// The checksum, exactly (all arithmetic on uint64_t, wrapping):
//   Mix(z)     = splitmix64's finalizer: z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
//                z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31
//   seed(l, p) = Mix((l << 48) ^ p ^ 0x9e3779b97f4a7c15)   (layer l < 2^16, position p < 2^48:
//                distinct (l, p) give distinct seeds, Mix being a bijection)
//   entry(l, p, x[0..W)) = sum over w of Mix(x[w] ^ (seed(l, p) + (w + 1) * 0x9e3779b97f4a7c15))
// where x[w] is the entry's w-th 8-byte word read little-endian (W = entry_bytes / 8), and
// a set of entries sums to the wrapping sum of their entry() values. Changing any word
// changes its term (Mix is a bijection); moving a word to another word index, position or
// layer changes its salt.
//
// Performance: 16-byte vector loads (non-caching) and stores; one warp per tile, a tile
// being a group of consecutive slots of one block of one layer (so contiguous on both
// sides, at most 32 KiB); a grid of up to 8 CTAs of 4 warps per SM strides over the tiles.
// Tiles shrink (down to one entry) for small copies so that one layer of a short sequence
// still spreads over all SMs. Each lane sums its checksum terms; one atomicAdd per warp.
// With programmatic dependent launch on (launch_control.h), the kernel waits for its
// predecessor before reading anything and lets its successor launch at once. Measured
// between two H200s (bench/README.md): one call over 27 layers moves 0.90-1.08 of a
// contiguous cudaMemcpyPeer's GB/s; each call also costs a fixed ~3.6 us of GPU time, so
// one call per layer of a short sequence is launch-bound (copy several layers per call).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

struct KvBlockCopyParams {
  const void* src = nullptr;       // source pool base, 16-byte aligned, readable from the current device
  void* dst = nullptr;             // destination pool base (IPC/peer mapping), 16-byte aligned; null: checksum only
  int64_t src_num_blocks = 0;      // blocks per layer of the source pool
  int64_t dst_num_blocks = 0;      // blocks per layer of the destination pool (ignored without dst)
  int64_t block_size = 64;         // slots per block
  int64_t entry_bytes = 0;         // bytes per position and layer, a multiple of 16
  int64_t layer_begin = 0;         // layers [layer_begin, layer_end); both pools hold them
  int64_t layer_end = 0;
  const int32_t* src_blocks = nullptr;  // device: the source block table (position p in [p / block_size])
  const int32_t* dst_blocks = nullptr;  // device: the destination block table (ignored without dst)
  int64_t begin = 0;               // positions [begin, end)
  int64_t end = 0;
  unsigned long long* checksum = nullptr;  // device; the entries' checksum is added (may be null)
};

// Launches on `stream` (the current device must be the one `src` is on, or one that can
// read it); allocates nothing, so it can be captured in a CUDA graph. Block tables must
// cover [begin, end): an entry whose source or destination block id is outside
// [0, num_blocks) is neither copied nor summed (the receiver's checksum then disagrees).
// Returns cudaErrorInvalidValue, launching nothing, for: entry_bytes <= 0 or not a
// multiple of 16, block_size <= 0, num_blocks <= 0 for a pool used, negative ranges or
// end < begin, layer_begin < 0, layer_end > 2^16, end > 2^48, a null src or block table
// of a side used, a pool base not 16-byte aligned, and dst and checksum both null (nothing
// to do). After those checks, an empty range (begin == end or layer_begin == layer_end)
// succeeds and launches nothing. Otherwise the launch's error. The pools must not overlap.
cudaError_t KvBlockCopy(const KvBlockCopyParams& p, cudaStream_t stream);

// The checksum of one entry (`entry_bytes` bytes, a multiple of 8) of `layer` at
// `position`, as defined above; a pool's checksum is the wrapping sum of its entries'.
uint64_t KvEntryChecksum(int64_t layer, int64_t position, const void* entry, int64_t entry_bytes);

// How many consecutive layers one KvBlockCopy of a prefill's KV should cover when each
// layer holds `bytes_per_layer` bytes: a launch's fixed ~3.6 us is ~1.4 MB of NVLink time,
// so each launch carries at least kKvCopyMinLaunchBytes (measured: 8 MiB launches reach
// 0.79-0.82 of a peer copy, 32 MiB ones ~0.86-0.9), while a large chunk (>= 32 MiB per
// layer, e.g. 28K tokens) still goes out layer by layer.
inline constexpr int64_t kKvCopyMinLaunchBytes = int64_t{32} << 20;
inline int64_t KvCopyLayersPerLaunch(int64_t bytes_per_layer) {
  if (bytes_per_layer <= 0) return 1;
  return (kKvCopyMinLaunchBytes + bytes_per_layer - 1) / bytes_per_layer;
}

}  // namespace tandem::cuda
