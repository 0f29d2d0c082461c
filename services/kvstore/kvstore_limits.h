// Bounds on the work one tandem.v1.KvStore call may ask of an instance, shared by the
// service (which refuses calls beyond them) and the client (which splits its requests so
// that correct use never meets them).
#pragma once

namespace tandem::kvstore {

// Block hashes in one Lookup, Reserve, Commit or Get. 4096 blocks of 64 tokens are 256K
// tokens, beyond the context of every model served (DeepSeek-V3: 160K tokens, 2,560
// blocks), so a request's prefix takes one call per instance; a call of 4096 hashes is
// 32 KiB and its work (hash-map probes, slot bookkeeping) a fraction of a millisecond.
inline constexpr int kMaxHashesPerCall = 4096;

// Gets waiting for an instance's I/O thread. A Get waiting behind this many is refused
// with RESOURCE_EXHAUSTED: a prefill replica then computes the prefix instead (its
// fetch deadline, 2 s by default, would pass in the queue anyway).
inline constexpr int kMaxQueuedGets = 256;

}  // namespace tandem::kvstore
