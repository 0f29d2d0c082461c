#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <unordered_map>

#include <cooperative_groups.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launch_control.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;     // 8 bits of the order key per radix pass
constexpr int kGather = 2048;  // a bin this small is sorted and walked token by token
constexpr unsigned kFull = 0xffffffffu;
// Per-warp histograms: counts, then masses; the gathered keys reuse the same bytes.
constexpr size_t kHistCountBytes = sizeof(uint32_t) * kWarps * kBins;
constexpr size_t kDynamicSmem = kHistCountBytes + sizeof(double) * kWarps * kBins;
// Gather's two key arrays (this block's, then the cluster's) reuse the histogram bytes.
static_assert(kHistCountBytes >= 2 * sizeof(uint64_t) * kGather, "the gathered keys must fit in the histogram space");
constexpr int kMaxCluster = 16;  // blocks per row (a non-portable cluster size on sm_90)

// --- The CPU Sampler's arithmetic (engine/runtime/sampler.cc), operation for operation. ---

// SamplerExp: Cephes' expf with fused multiply-adds where the CPU fuses them (x86-64-v3).
__device__ __forceinline__ float SamplerExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  if (!(x >= -87.0f)) return 0.0f;
  const float fx = rintf(__fmul_rn(x, kLog2e));
  float r = fmaf(fx, -kLn2Hi, x);
  r = fmaf(fx, -kLn2Lo, r);
  float y = 1.9875691500e-4f;
  y = fmaf(y, r, 1.3981999507e-3f);
  y = fmaf(y, r, 8.3334519073e-3f);
  y = fmaf(y, r, 4.1665795894e-2f);
  y = fmaf(y, r, 1.6666665459e-1f);
  y = fmaf(y, r, 5.0000001201e-1f);
  y = fmaf(y, __fmul_rn(r, r), r);
  y = __fadd_rn(y, 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(fx) + 127) << 23;
  return __fmul_rn(y, __uint_as_float(bits));
}

__device__ __forceinline__ uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// UniformFromSeedStep.
__device__ __forceinline__ double Uniform(uint64_t seed, int64_t step) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
  const uint64_t h = Mix64(Mix64(seed + kGamma) ^ (static_cast<uint64_t>(step) + kGamma));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// ~OrderedBits(logit): ascending = logit descending (-0 counts as +0).
__device__ __forceinline__ uint32_t DescKey(float logit) {
  const uint32_t u = __float_as_uint(__fadd_rn(logit, 0.0f));
  return ~((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}
__device__ __forceinline__ float LogitOf(uint32_t desc_key) {
  const uint32_t ordered = ~desc_key;
  return __uint_as_float((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}
// Canonical key: ascending = canonical order (logit descending, then id ascending).
__device__ __forceinline__ uint64_t Key(uint32_t desc_key, int id) {
  return (static_cast<uint64_t>(desc_key) << 32) | static_cast<uint32_t>(id);
}
__device__ __forceinline__ int KeyId(uint64_t key) { return static_cast<int>(key & 0xffffffffu); }

// One row's logits (the whole vocabulary: a gathered key may name any id) and the weight
// function of its sampling parameters.
struct Row {
  const float* logits;
  float max;
  float inv_t;
  __device__ __forceinline__ float Weight(float logit) const {
    return SamplerExp(__fmul_rn(__fsub_rn(logit, max), inv_t));
  }
};

// --- The cluster of blocks that samples one row. ---
//
// A row is sampled by a cluster of `size` blocks (thread-block cluster, sm_90), block `rank`
// taking the vocabulary slice [lo, hi). Every block-wide reduction becomes block partials
// combined over the cluster through distributed shared memory, in rank order, by every
// block alike: all blocks of a cluster hold the same values after each exchange and so take
// the same decisions (and call the same cluster barriers). One barrier per exchange: a block
// publishes into one of two slot sets, alternately; by the time a set is written again,
// every block has passed the barrier of the exchange in between, so has read it.

// A block's share of a cluster-wide reduction (which fields mean what: the caller's).
struct Partial {
  double d0, d1;
  uint64_t u0, u1;
  int i0, i1;
  float f;
};

struct Shared {
  uint32_t bin_count[kBins];  // a level's histogram, merged over the cluster
  double bin_mass[kBins];
  uint32_t pub_count[2][kBins];  // this block's histogram, published (alternating sets)
  double pub_mass[2][kBins];
  Partial pub[2];                // this block's partial, published (alternating sets)
  double red_d[kWarps];
  uint64_t red_u[kWarps];
  int red_i[kWarps];
  float red_f[kWarps];
  unsigned ballots[kWarps];
  int chosen;
  int64_t acc_count;
  double acc_mass;
  int gathered;
  uint64_t found_key;
  double found_mass;
  int j;
  int id;
  int remaining;
};

struct Slice {
  int rank, size;  // this block in the row's cluster
  int lo, hi;      // its vocabulary slice
  int phase;       // the slot set the next exchange publishes into
};

__device__ __forceinline__ void ClusterSync() { cg::this_cluster().sync(); }

template <typename T>
__device__ __forceinline__ T* RemoteOf(T* local, int rank) {
  return cg::this_cluster().map_shared_rank(local, rank);
}

__device__ __forceinline__ Partial ShflPartial(const Partial& v, int lane) {
  Partial o;
  o.d0 = __shfl_sync(kFull, v.d0, lane);
  o.d1 = __shfl_sync(kFull, v.d1, lane);
  o.u0 = __shfl_sync(kFull, v.u0, lane);
  o.u1 = __shfl_sync(kFull, v.u1, lane);
  o.i0 = __shfl_sync(kFull, v.i0, lane);
  o.i1 = __shfl_sync(kFull, v.i1, lane);
  o.f = __shfl_sync(kFull, v.f, lane);
  return o;
}

// Combines every block's `mine` (a block total: the same in all its threads) with `op`, in
// rank order; every thread of every block of the cluster gets the same result. Lane r of
// each warp reads block r's partial, then the warp folds them with shuffles.
template <typename Op>
__device__ Partial ClusterCombine(const Partial& mine, Op op, Slice& c, Shared& s) {
  Partial* slot = &s.pub[c.phase];
  c.phase ^= 1;
  if (threadIdx.x == 0) *slot = mine;
  ClusterSync();
  const int lane = threadIdx.x % 32;
  Partial theirs = mine;
  if (lane < c.size) theirs = *RemoteOf(slot, lane);
  Partial acc = ShflPartial(theirs, 0);
  for (int r = 1; r < c.size; ++r) acc = op(acc, ShflPartial(theirs, r));
  return acc;
}

// --- Block-wide helpers (every thread calls them; results in a fixed order). ---

__device__ __forceinline__ double WarpSumD(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

__device__ double BlockSumD(double v, Shared& s) {
  v = WarpSumD(v);
  if (threadIdx.x % 32 == 0) s.red_d[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += s.red_d[w];
  __syncthreads();
  return total;
}

__device__ int BlockSumI(int v, Shared& s) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
  if (threadIdx.x % 32 == 0) s.red_i[threadIdx.x / 32] = v;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.red_i[w];
  __syncthreads();
  return total;
}

__device__ int BlockMinI(int v, Shared& s) {
  for (int off = 16; off > 0; off /= 2) v = min(v, __shfl_xor_sync(kFull, v, off));
  if (threadIdx.x % 32 == 0) s.red_i[threadIdx.x / 32] = v;
  __syncthreads();
  int m = INT_MAX;
  for (int w = 0; w < kWarps; ++w) m = min(m, s.red_i[w]);
  __syncthreads();
  return m;
}

__device__ float BlockMaxF(float v, Shared& s) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  if (threadIdx.x % 32 == 0) s.red_f[threadIdx.x / 32] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s.red_f[w]);
  __syncthreads();
  return m;
}

__device__ uint64_t BlockMaxU(uint64_t v, Shared& s) {
  for (int off = 16; off > 0; off /= 2) {
    const uint64_t o = __shfl_xor_sync(kFull, v, off);
    v = o > v ? o : v;
  }
  if (threadIdx.x % 32 == 0) s.red_u[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t m = 0;
  for (int w = 0; w < kWarps; ++w) m = s.red_u[w] > m ? s.red_u[w] : m;
  __syncthreads();
  return m;
}

// Adds the warp's valid (bin, w) pairs to the warp's own histogram (no atomics; a fixed
// order of additions for a given input). One bin among the lanes (common in the first
// pass): a warp sum. Several: each lane's weight goes to its bin's lowest lane, lanes in
// ascending order, one shuffle a lane — a warp sum per distinct bin would cost a
// five-step double reduction each.
__device__ __forceinline__ void WarpAccumulate(bool valid, int bin, float w, uint32_t* count, double* mass) {
  const int lane = threadIdx.x % 32;
  const unsigned active = __ballot_sync(kFull, valid);
  if (active == 0u) return;
  const unsigned group = __match_any_sync(kFull, valid ? bin : -1) & active;
  const bool leader = valid && lane == __ffs(group) - 1;
  const unsigned leaders = __ballot_sync(kFull, leader);
  if (__popc(leaders) == 1) {
    const double m = WarpSumD(valid ? static_cast<double>(w) : 0.0);
    if (leader) {
      count[bin] += __popc(group);
      mass[bin] += m;
    }
    return;
  }
  // Unrolled: the shuffles are independent, only the leaders' additions chain. Invalid
  // lanes are in no valid lane's group.
  double m = 0.0;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const float v = __shfl_sync(kFull, w, l);
    if ((group >> l) & 1u) m += static_cast<double>(v);
  }
  if (leader) {
    count[bin] += __popc(group);
    mass[bin] += m;
  }
}

// --- Locating a boundary of the canonical order. ---

enum class Criterion { kCount, kMassAtLeast, kMassAbove };

struct Target {
  Criterion criterion;
  int64_t count;
  double mass;
  __device__ __forceinline__ bool Reached(int64_t c, double m) const {
    switch (criterion) {
      case Criterion::kCount: return c >= count;
      case Criterion::kMassAtLeast: return m >= mass;
      default: return m > mass;
    }
  }
};

struct Found {
  bool found;
  uint64_t key;  // the boundary token's canonical key
  double mass;   // weight of the prefix through it
};

// The tokens a search looks at: candidates (w > 0) with key <= bound whose order key
// starts with `prefix` (its `bits` high bits).
__device__ __forceinline__ bool InRange(const Row& r, int i, float logit, uint32_t dk, uint64_t bound,
                                        uint32_t prefix, int bits, float* w) {
  if (bits > 0 && (dk >> (32 - bits)) != prefix) return false;
  if (Key(dk, i) > bound) return false;
  *w = r.Weight(logit);
  return *w > 0.0f;
}

// The boundary lies among the `bits`-bit prefix's tokens (at most kGather in the cluster),
// after acc_count tokens weighing acc_mass: every block gathers its slice's keys, copies the
// cluster's into one array (block by block), sorts it and walks it in canonical order.
__device__ Found Gather(const Row& r, const Target& target, uint64_t bound, uint32_t prefix, int bits,
                        int64_t acc_count, double acc_mass, uint64_t* hist_space, Slice& c, Shared& s) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  uint64_t* mine = hist_space;          // [kGather]: this block's, read by the others
  uint64_t* keys = hist_space + kGather;  // [kGather]: the cluster's
  if (tid == 0) s.gathered = 0;
  __syncthreads();
  for (int base = c.lo; base < c.hi; base += kThreads) {
    const int i = base + tid;
    bool valid = false;
    uint64_t key = 0;
    if (i < c.hi) {
      const float l = r.logits[i];
      const uint32_t dk = DescKey(l);
      float w;
      valid = InRange(r, i, l, dk, bound, prefix, bits, &w);
      key = Key(dk, i);
    }
    const unsigned ballot = __ballot_sync(kFull, valid);
    int pos = 0;
    if (lane == 0 && ballot != 0u) pos = atomicAdd(&s.gathered, __popc(ballot));
    pos = __shfl_sync(kFull, pos, 0);
    if (valid) {
      const int at = pos + __popc(ballot & ((1u << lane) - 1u));
      if (at < kGather) mine[at] = key;
    }
  }
  __syncthreads();
  Partial* slot = &s.pub[c.phase];
  c.phase ^= 1;
  if (tid == 0) slot->i0 = min(s.gathered, kGather);
  ClusterSync();
  int n = 0;
  for (int q = 0; q < c.size; ++q) {
    const int count = RemoteOf(slot, q)->i0;
    const uint64_t* src = RemoteOf(mine, q);
    for (int i = tid; i < count && n + i < kGather; i += kThreads) keys[n + i] = src[i];
    n = min(n + count, kGather);
  }
  ClusterSync();  // every block has its copy: `mine` may be overwritten
  if (n == 0) return Found{false, 0, 0.0};  // not reached: the chosen bin holds tokens
  int padded = 1;
  while (padded < n) padded *= 2;
  for (int i = n + tid; i < padded; i += kThreads) keys[i] = ~uint64_t{0};
  __syncthreads();
  // Bitonic sort, ascending.
  for (int k = 2; k <= padded; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = tid; i < padded; i += kThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const uint64_t a = keys[i], b = keys[partner];
          if ((a > b) == ((i & k) == 0)) {
            keys[i] = b;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  // Walk: lane l takes a contiguous run of the sorted tokens; the runs' masses are scanned
  // across the lanes, then each lane continues from its run's start.
  if (warp == 0) {
    const int per = (n + 31) / 32;
    const int lo = min(n, lane * per), hi = min(n, lo + per);
    double run = 0.0;
    for (int j = lo; j < hi; ++j) run += r.Weight(r.logits[KeyId(keys[j])]);
    double inclusive = run;
    for (int off = 1; off < 32; off *= 2) {
      const double o = __shfl_up_sync(kFull, inclusive, off);
      if (lane >= off) inclusive += o;
    }
    double before = __shfl_up_sync(kFull, inclusive, 1);
    if (lane == 0) before = 0.0;
    double m = acc_mass + before;
    int64_t cnt = acc_count + lo;
    int hit = -1;
    for (int j = lo; j < hi; ++j) {
      m += r.Weight(r.logits[KeyId(keys[j])]);
      ++cnt;
      if (target.Reached(cnt, m)) {
        hit = j;
        break;
      }
    }
    const unsigned any = __ballot_sync(kFull, hit >= 0);
    // Rounding can leave the whole bin short of a target its histogram reached: then the
    // boundary is its last token.
    const int src = any != 0u ? __ffs(any) - 1 : 31;
    hit = __shfl_sync(kFull, any != 0u ? hit : n - 1, src);
    m = __shfl_sync(kFull, m, src);
    if (lane == 0) {
      s.found_key = keys[hit];
      s.found_mass = m;
    }
  }
  __syncthreads();
  const Found f{true, s.found_key, s.found_mass};
  __syncthreads();
  return f;
}

// The id of the j-th (1-based) token, in id order, among the search's tokens of order key
// dk (a tie group larger than kGather): the cluster counts each slice's, the block whose
// slice holds the j-th finds it, and the cluster takes its answer.
__device__ int NthInTieGroup(const Row& r, uint32_t dk, int j, uint64_t bound, Slice& c, Shared& s) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  auto matches = [&](int i) {
    const float l = r.logits[i];
    return DescKey(l) == dk && Key(dk, i) <= bound && r.Weight(l) > 0.0f;
  };
  int mine = 0;
  for (int i = c.lo + tid; i < c.hi; i += kThreads) mine += matches(i) ? 1 : 0;
  mine = BlockSumI(mine, s);
  Partial* slot = &s.pub[c.phase];
  c.phase ^= 1;
  if (tid == 0) slot->i0 = mine;
  ClusterSync();
  int remaining = j, holder = -1;
  for (int q = 0; q < c.size && holder < 0; ++q) {
    const int count = RemoteOf(slot, q)->i0;
    if (count >= remaining) {
      holder = q;
    } else {
      remaining -= count;
    }
  }
  int found = -1;
  if (holder == c.rank) {
    for (int base = c.lo; base < c.hi && found < 0; base += kThreads) {
      const int i = base + tid;
      const bool match = i < c.hi && matches(i);
      const unsigned ballot = __ballot_sync(kFull, match);
      if (lane == 0) s.ballots[warp] = ballot;
      __syncthreads();
      if (tid == 0) {
        int at = -1;
        for (int w = 0; w < kWarps && at < 0; ++w) {
          const int cnt = __popc(s.ballots[w]);
          if (cnt >= remaining) {
            unsigned b = s.ballots[w];
            for (int k = 1; k < remaining; ++k) b &= b - 1u;
            at = base + w * 32 + __ffs(b) - 1;
          } else {
            remaining -= cnt;
          }
        }
        s.id = at;
        s.remaining = remaining;
      }
      __syncthreads();
      found = s.id;
      remaining = s.remaining;
      __syncthreads();
    }
  }
  Partial p{};
  p.i0 = found;
  p = ClusterCombine(p, [](Partial a, const Partial& b) { a.i0 = max(a.i0, b.i0); return a; }, c, s);
  return max(p.i0, 0);  // -1 unreachable: the group has at least j tokens
}

// The first token (canonical order) among the candidates with key <= bound at which the
// prefix reaches the target; not found when even all of them fall short.
__device__ Found Search(const Row& r, const Target& target, uint64_t bound, uint32_t* hist_count, double* hist_mass,
                        Slice& c, Shared& s) {
  const int tid = threadIdx.x, warp = tid / 32;
  uint32_t prefix = 0;
  int bits = 0;
  int64_t acc_count = 0;
  double acc_mass = 0.0;
  uint32_t in_bin = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    for (int i = tid; i < kWarps * kBins; i += kThreads) {
      hist_count[i] = 0;
      hist_mass[i] = 0.0;
    }
    __syncthreads();
    for (int base = c.lo; base < c.hi; base += kThreads) {
      const int i = base + tid;
      bool valid = false;
      int bin = 0;
      float w = 0.0f;
      if (i < c.hi) {
        const float l = r.logits[i];
        const uint32_t dk = DescKey(l);
        valid = InRange(r, i, l, dk, bound, prefix, bits, &w);
        bin = static_cast<int>((dk >> shift) & 0xffu);
      }
      WarpAccumulate(valid, bin, w, hist_count + warp * kBins, hist_mass + warp * kBins);
    }
    __syncthreads();
    // This block's histogram, published; then the cluster's, block by block.
    const int set = c.phase;
    c.phase ^= 1;
    for (int b = tid; b < kBins; b += kThreads) {
      uint32_t cnt = 0;
      double m = 0.0;
      for (int w = 0; w < kWarps; ++w) {
        cnt += hist_count[w * kBins + b];
        m += hist_mass[w * kBins + b];
      }
      s.pub_count[set][b] = cnt;
      s.pub_mass[set][b] = m;
    }
    ClusterSync();
    for (int b = tid; b < kBins; b += kThreads) {
      uint32_t cnt = 0;
      double m = 0.0;
      for (int q = 0; q < c.size; ++q) {
        cnt += *RemoteOf(&s.pub_count[set][b], q);
        m += *RemoteOf(&s.pub_mass[set][b], q);
      }
      s.bin_count[b] = cnt;
      s.bin_mass[b] = m;
    }
    __syncthreads();
    if (tid == 0) {
      int chosen = -1;
      int64_t cnt = acc_count;
      double m = acc_mass;
      for (int b = 0; b < kBins; ++b) {
        if (s.bin_count[b] == 0) continue;
        const int64_t c2 = cnt + s.bin_count[b];
        const double m2 = m + s.bin_mass[b];
        if (target.Reached(c2, m2)) {
          chosen = b;
          break;
        }
        cnt = c2;
        m = m2;
      }
      s.chosen = chosen;
      s.acc_count = cnt;
      s.acc_mass = m;
    }
    __syncthreads();
    const int chosen = s.chosen;
    if (chosen < 0) return Found{false, 0, 0.0};
    acc_count = s.acc_count;
    acc_mass = s.acc_mass;
    in_bin = s.bin_count[chosen];
    __syncthreads();
    prefix = (prefix << 8) | static_cast<uint32_t>(chosen);
    bits += 8;
    if (in_bin <= kGather) {
      return Gather(r, target, bound, prefix, bits, acc_count, acc_mass, reinterpret_cast<uint64_t*>(hist_count), c,
                    s);
    }
  }
  // More than kGather tokens of one logit: count them off in id order.
  const float wg = r.Weight(LogitOf(prefix));
  if (tid == 0) {
    int64_t cnt = acc_count;
    double m = acc_mass;
    int j = 0;
    while (j < static_cast<int>(in_bin)) {
      ++j;
      ++cnt;
      m += wg;
      if (target.Reached(cnt, m)) break;
    }
    s.j = j;
    s.found_mass = m;
  }
  __syncthreads();
  const int j = s.j;
  const double mass = s.found_mass;
  __syncthreads();
  return Found{true, Key(prefix, NthInTieGroup(r, prefix, j, bound, c, s)), mass};
}

// Samples one row (every block of its cluster calls it, with the same result; block 0
// stores the token).
__device__ void SampleRow(const SampleParams& p, int row, Slice& c, uint32_t* hist_count, double* hist_mass,
                          Shared& s) {
  const int tid = threadIdx.x;
  const SampleRowParams rp = p.row_params[row];
  float* logits = p.logits + static_cast<int64_t>(row) * p.stride;
  const bool writer = c.rank == 0 && tid == 0;

  // 1. Penalties: one thread per distinct token of this block's slice, in the CPU's order
  // of operations (the cluster barrier of the max below publishes them to the other blocks).
  if (rp.penalty_count > 0 && p.penalties != nullptr) {
    const bool repetition = rp.repetition_penalty != 1.0f;
    const bool counted = rp.presence_penalty != 0.0f || rp.frequency_penalty != 0.0f;
    for (int e = tid; e < rp.penalty_count; e += kThreads) {
      const PenaltyEntry entry = p.penalties[rp.penalty_begin + e];
      if (entry.id < c.lo || entry.id >= c.hi) continue;
      float x = logits[entry.id];
      if (repetition) x = x > 0.0f ? __fdiv_rn(x, rp.repetition_penalty) : __fmul_rn(x, rp.repetition_penalty);
      if (counted && entry.output_count > 0) {
        x = __fsub_rn(x, __fmul_rn(rp.frequency_penalty, static_cast<float>(entry.output_count)));
        x = __fsub_rn(x, rp.presence_penalty);
      }
      logits[entry.id] = x;
    }
  }
  __syncthreads();

  float mx = -INFINITY;
  for (int i = c.lo + tid; i < c.hi; i += kThreads) mx = fmaxf(mx, logits[i]);
  Partial part{};
  part.f = BlockMaxF(mx, s);
  mx = ClusterCombine(part, [](Partial a, const Partial& b) { a.f = fmaxf(a.f, b.f); return a; }, c, s).f;
  // 2. Greedy.
  if (rp.temperature < kSampleGreedyTemperature) {
    int first = INT_MAX;
    for (int i = c.lo + tid; i < c.hi; i += kThreads) {
      if (logits[i] == mx) {
        first = i;
        break;
      }
    }
    part.i0 = BlockMinI(first, s);
    first = ClusterCombine(part, [](Partial a, const Partial& b) { a.i0 = min(a.i0, b.i0); return a; }, c, s).i0;
    if (writer) p.out[row] = first == INT_MAX ? 0 : first;
    return;
  }
  if (!(mx > -INFINITY)) {  // no finite logit (the CPU Sampler aborts)
    if (writer) p.out[row] = 0;
    return;
  }

  // 3. Candidates, their mass, min-p's set, the last candidate of each.
  const Row r{logits, mx, __fdiv_rn(1.0f, rp.temperature)};
  int candidates = 0, min_p_count = 0;
  double total = 0.0, min_p_mass = 0.0;
  uint64_t last = 0, min_p_last = 0;
  for (int i = c.lo + tid; i < c.hi; i += kThreads) {
    const float l = logits[i];
    const float w = r.Weight(l);
    if (!(w > 0.0f)) continue;
    const uint64_t key = Key(DescKey(l), i);
    ++candidates;
    total += w;
    last = key > last ? key : last;
    if (w >= rp.min_p) {
      ++min_p_count;
      min_p_mass += w;
      min_p_last = key > min_p_last ? key : min_p_last;
    }
  }
  part.i0 = BlockSumI(candidates, s);
  part.i1 = BlockSumI(min_p_count, s);
  part.d0 = BlockSumD(total, s);
  part.d1 = BlockSumD(min_p_mass, s);
  part.u0 = BlockMaxU(last, s);
  part.u1 = BlockMaxU(min_p_last, s);
  part = ClusterCombine(part,
                        [](Partial a, const Partial& b) {
                          a.i0 += b.i0;
                          a.i1 += b.i1;
                          a.d0 += b.d0;
                          a.d1 += b.d1;
                          a.u0 = b.u0 > a.u0 ? b.u0 : a.u0;
                          a.u1 = b.u1 > a.u1 ? b.u1 : a.u1;
                          return a;
                        },
                        c, s);
  candidates = part.i0;
  min_p_count = part.i1;
  total = part.d0;
  min_p_mass = part.d1;
  last = part.u0;
  min_p_last = part.u1;

  // The kept set is always a canonical prefix: the candidates with key <= bound.
  uint64_t bound = last;
  int64_t n = candidates;
  double top_k_mass = total;
  if (rp.top_k > 0 && rp.top_k < n) {
    const Found f = Search(r, Target{Criterion::kCount, rp.top_k, 0.0}, bound, hist_count, hist_mass, c, s);
    bound = f.key;
    n = rp.top_k;
    top_k_mass = f.mass;
  }
  double kept = top_k_mass;
  if (rp.min_p > 0.0f && min_p_count < n) {
    n = min_p_count;
    kept = min_p_mass;
    bound = min_p_last;
  }
  if (rp.top_p < 1.0f) {
    const Found f = Search(r, Target{Criterion::kMassAtLeast, 0, static_cast<double>(rp.top_p) * top_k_mass}, bound,
                           hist_count, hist_mass, c, s);
    if (f.found) {
      bound = f.key;
      kept = f.mass;
    }
  }
  // Inverse CDF.
  const double u = Uniform(rp.seed, rp.step);
  const Found f = Search(r, Target{Criterion::kMassAbove, 0, u * kept}, bound, hist_count, hist_mass, c, s);
  if (writer) p.out[row] = KeyId(f.found ? f.key : bound);
}

// Grid: rows x cluster blocks, clusters of `cluster` consecutive blocks (one per row).
__global__ void __launch_bounds__(kThreads, 1) SampleKernel(SampleParams p) {
  extern __shared__ __align__(16) unsigned char dyn[];
  __shared__ Shared s;
  uint32_t* hist_count = reinterpret_cast<uint32_t*>(dyn);
  double* hist_mass = reinterpret_cast<double*>(dyn + kHistCountBytes);
  internal::WaitAndTrigger();
  const cg::cluster_group cluster = cg::this_cluster();
  Slice c;
  c.rank = static_cast<int>(cluster.block_rank());
  c.size = static_cast<int>(cluster.num_blocks());
  const int per = (p.vocab + c.size - 1) / c.size;
  c.lo = min(p.vocab, c.rank * per);
  c.hi = min(p.vocab, c.lo + per);
  c.phase = 0;
  SampleRow(p, static_cast<int>(blockIdx.x) / c.size, c, hist_count, hist_mass, s);
  ClusterSync();  // no block leaves while another may still read its shared memory
}

// SampleKernel's launch of `blocks` blocks in clusters of `cluster`: *config with attrs[0]
// (the cluster shape) as its one attribute.
void ClusterLaunchConfig(int blocks, int cluster, cudaStream_t stream, cudaLaunchConfig_t* config,
                         cudaLaunchAttribute* attrs) {
  *config = {};
  config->gridDim = dim3(static_cast<unsigned>(blocks));
  config->blockDim = dim3(kThreads);
  config->dynamicSmemBytes = kDynamicSmem;
  config->stream = stream;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  config->attrs = attrs;
  config->numAttrs = 1;
}

// The kernel's attributes, set once: its dynamic shared memory limit (the error if that
// fails) and the largest cluster (a power of two up to kMaxCluster) the device can run.
struct KernelSetup {
  cudaError_t error = cudaSuccess;
  int max_cluster = 1;
};

const KernelSetup& Setup() {
  static const KernelSetup setup = [] {
    KernelSetup k;
    k.error = cudaFuncSetAttribute(SampleKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kDynamicSmem));
    if (k.error != cudaSuccess) return k;
    if (cudaFuncSetAttribute(SampleKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();  // portable sizes (up to 8) only
    }
    for (int blocks = kMaxCluster; blocks > 1; blocks /= 2) {
      cudaLaunchConfig_t config;
      cudaLaunchAttribute attr[1];
      ClusterLaunchConfig(blocks, blocks, nullptr, &config, attr);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, SampleKernel, &config) == cudaSuccess && clusters > 0) {
        k.max_cluster = blocks;
        return k;
      }
      (void)cudaGetLastError();
    }
    return k;
  }();
  return setup;
}

}  // namespace

int SampleClusterBlocks(int rows) {
  if (rows <= 0) return 1;
  const int want = std::max(1, CurrentDeviceMultiprocessors() / rows);
  int blocks = 1;
  while (blocks * 2 <= std::min(want, Setup().max_cluster)) blocks *= 2;
  return blocks;
}

cudaError_t SampleTokens(const SampleParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.row_params == nullptr || p.out == nullptr || p.rows < 0 || p.vocab <= 0 ||
      p.stride < p.vocab || p.cluster_blocks < 0 || p.cluster_blocks > kMaxCluster ||
      (p.cluster_blocks & (p.cluster_blocks - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  if (Setup().error != cudaSuccess) return Setup().error;
  const int cluster = p.cluster_blocks > 0 ? p.cluster_blocks : SampleClusterBlocks(p.rows);
  if (cluster > Setup().max_cluster) return cudaErrorInvalidValue;
  if (static_cast<int64_t>(p.rows) * cluster > INT_MAX) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attrs[2];
  ClusterLaunchConfig(p.rows * cluster, cluster, stream, &config, attrs);
  if (ProgrammaticLaunch()) {
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&config, SampleKernel, p);
}

void AppendPenaltyEntries(const int32_t* prompt, size_t prompt_len, const int32_t* output, size_t output_len,
                          std::vector<PenaltyEntry>* entries) {
  std::unordered_map<int32_t, size_t> at;  // id -> index in *entries
  at.reserve(prompt_len + output_len);
  auto add = [&](int32_t id, int32_t count) {
    const auto [it, inserted] = at.try_emplace(id, entries->size());
    if (inserted) entries->push_back({id, 0});
    (*entries)[it->second].output_count += count;
  };
  for (size_t i = 0; i < prompt_len; ++i) add(prompt[i], 0);
  for (size_t i = 0; i < output_len; ++i) add(output[i], 1);
}

}  // namespace tandem::cuda
