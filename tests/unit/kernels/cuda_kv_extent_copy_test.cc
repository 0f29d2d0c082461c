// KvExtentCopy (kernels/cuda/kv_extent_copy.h) against a host reference copy: ~50 extents
// of mixed sizes (0 bytes to ~200 KiB; 8- but not 16-byte multiples; offsets 8 past a
// 16-byte boundary on either side) copied to shuffled places of a destination pool, whose
// other bytes keep their pattern; the device checksum equals KvExtentsChecksum whether
// computed while copying, over the source alone, or over the destination alone (the
// receiver's check). Bad extents are flagged and neither copied nor summed. Exact
// comparisons throughout: the kernel moves bytes and sums integers. GPU cases skip,
// saying why, where no GPU is usable; the host-only cases (the documented formula, what
// the checksum catches, parameter checks) run everywhere.
#include "kernels/cuda/kv_extent_copy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/cuda/launch_control.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using cuda::KvExtentCopy;
using cuda::KvExtentCopyParams;
using cuda::KvExtentPair;
using cuda::KvExtentsChecksum;
using cuda::NumberKvExtentWords;
using testing::Dev;

using Bytes = std::vector<unsigned char>;

// The header's formula, written out independently of the library.
uint64_t Splitmix64Finalizer(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t DocumentedChecksum(const Bytes& pool, const std::vector<KvExtentPair>& extents) {
  const uint64_t golden = 0x9e3779b97f4a7c15ull;
  uint64_t sum = 0, g = 0;
  for (const KvExtentPair& e : extents) {
    for (uint64_t w = 0; w < e.bytes / 8; ++w, ++g) {
      uint64_t x = 0;
      for (int b = 7; b >= 0; --b) x = (x << 8) | pool[e.src_offset + 8 * w + b];  // little-endian
      const uint64_t l = static_cast<uint64_t>(e.layer);
      sum += Splitmix64Finalizer(x ^ (Splitmix64Finalizer((l << 48) ^ g ^ golden) + golden));
    }
  }
  return sum;
}

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes v(n);
  for (unsigned char& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// A destination's bytes before the copy: a pattern that no copied range reproduces.
Bytes Pattern(size_t n) {
  Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + 7);
  return v;
}

const std::byte* AsBytes(const Bytes& v) { return reinterpret_cast<const std::byte*>(v.data()); }

uint64_t Checksum(const Bytes& pool, const std::vector<KvExtentPair>& extents) {
  return KvExtentsChecksum(AsBytes(pool), extents);
}

// `count` extents of a source pool of `src_bytes`: sizes a third tiny (0 to 64 bytes), a
// third up to 8 KiB, a third up to 200 KiB, any multiple of 8; source offsets anywhere
// (ranges may overlap: they are only read), layers at random; destination ranges in a
// shuffled order with gaps of 0 to 5 words, so both offsets are 16-byte aligned or not
// in every combination. Numbered; *dst_bytes is the destination pool's size (a tail
// after the last range).
std::vector<KvExtentPair> RandomExtents(int count, uint64_t src_bytes, std::mt19937_64& rng, uint64_t* dst_bytes) {
  std::vector<KvExtentPair> extents(count);
  for (int i = 0; i < count; ++i) {
    const uint64_t limit[] = {64, 8 << 10, 200 << 10};
    KvExtentPair& e = extents[i];
    e.bytes = rng() % (limit[i % 3] / 8 + 1) * 8;
    e.src_offset = rng() % ((src_bytes - e.bytes) / 8 + 1) * 8;
    e.layer = static_cast<int64_t>(rng() % 61);
  }
  extents[1].bytes = 0;                              // empty, in the middle
  extents[4].bytes = 24;                             // odd word counts, 8 past 16-byte
  extents[4].src_offset = 8;                         //   boundaries
  extents[7].bytes = 200 << 10;                      // the largest, ending at the pool's end
  extents[7].src_offset = src_bytes - extents[7].bytes;
  extents[count - 1].bytes = 0;                      // empty, last
  extents[10].layer = (int64_t{1} << 16) - 1;        // the largest layer
  std::vector<int> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  uint64_t at = 0;
  for (int i : order) {
    at += rng() % 6 * 8;
    extents[i].dst_offset = at;
    at += extents[i].bytes;
  }
  *dst_bytes = at + 64;
  NumberKvExtentWords(extents);
  return extents;
}

// `pool` with each extent's source bytes copied to its destination range.
Bytes CopiedOnHost(const Bytes& src, Bytes dst, const std::vector<KvExtentPair>& extents) {
  for (const KvExtentPair& e : extents) std::memcpy(dst.data() + e.dst_offset, src.data() + e.src_offset, e.bytes);
  return dst;
}

// The receiver's list: the same extents, read at their destination ranges.
std::vector<KvExtentPair> DestinationSide(std::vector<KvExtentPair> extents) {
  for (KvExtentPair& e : extents) e.src_offset = e.dst_offset;
  return extents;
}

std::string FirstDifference(const Bytes& want, const Bytes& got) {
  if (got.size() != want.size()) return "size differs";
  const auto m = std::mismatch(want.begin(), want.end(), got.begin());
  if (m.first == want.end()) return "";
  return "byte " + std::to_string(m.first - want.begin()) + ": got " + std::to_string(*m.second) + ", want " +
         std::to_string(*m.first);
}

TEST(KvExtentsChecksumTest, MatchesTheDocumentedFormula) {
  std::mt19937_64 rng(1);
  const Bytes pool = RandomBytes(1 << 20, 2);
  uint64_t dst_bytes = 0;
  std::vector<KvExtentPair> extents = RandomExtents(50, pool.size(), rng, &dst_bytes);
  uint64_t words = 0;
  for (const KvExtentPair& e : extents) {
    EXPECT_EQ(e.first_word, words);
    words += e.bytes / 8;
  }
  EXPECT_EQ(NumberKvExtentWords(extents), words);
  EXPECT_EQ(Checksum(pool, extents), DocumentedChecksum(pool, extents));
  const Bytes zeros(64, 0);
  std::vector<KvExtentPair> one = {{.bytes = 64}};
  EXPECT_NE(Checksum(zeros, one), 0u);  // zero words still count
  one[0].bytes = 0;
  EXPECT_EQ(Checksum(zeros, one), 0u);
}

// Two layers' worth of equal-size extents and a small one, numbered.
std::vector<KvExtentPair> SmallList() {
  std::vector<KvExtentPair> e = {{.src_offset = 0, .bytes = 256, .layer = 3},
                                 {.src_offset = 256, .bytes = 256, .layer = 4},
                                 {.src_offset = 512, .bytes = 0, .layer = 5},
                                 {.src_offset = 512, .bytes = 40, .layer = 5}};
  NumberKvExtentWords(e);
  return e;
}

TEST(KvExtentsChecksumTest, DependsOnBytesPlacesAndLayers) {
  const Bytes pool = RandomBytes(552, 3);
  const std::vector<KvExtentPair> extents = SmallList();
  const uint64_t base = Checksum(pool, extents);
  for (size_t at : {size_t{0}, size_t{7}, size_t{255}, size_t{256}, size_t{551}}) {  // one byte, anywhere
    Bytes changed = pool;
    changed[at] ^= 0x01;
    EXPECT_NE(Checksum(changed, extents), base) << at;
  }
  std::vector<KvExtentPair> layers = extents;  // two equal-size extents' layers swapped
  std::swap(layers[0].layer, layers[1].layer);
  EXPECT_NE(Checksum(pool, layers), base);
  std::vector<KvExtentPair> order = extents;  // two equal-size extents' places swapped
  std::swap(order[0].src_offset, order[1].src_offset);
  EXPECT_NE(Checksum(pool, order), base);
  Bytes moved = pool;  // one word moved forward over two others (within an extent, then across)
  std::rotate(moved.begin() + 8, moved.begin() + 16, moved.begin() + 32);
  EXPECT_NE(Checksum(moved, extents), base);
  moved = pool;
  std::rotate(moved.begin() + 248, moved.begin() + 256, moved.begin() + 264);
  EXPECT_NE(Checksum(moved, extents), base);
}

// Host-only: every bad parameter set is refused before anything touches the device (the
// pointers below are never dereferenced), with or without extents.
TEST(KvExtentCopyParamsTest, InvalidParamsAreRefused) {
  alignas(16) static unsigned char fake[128];
  static KvExtentPair pairs[2];
  static unsigned long long sum;
  static int32_t bad;
  KvExtentCopyParams ok;
  ok.src = reinterpret_cast<const std::byte*>(fake);
  ok.src_bytes = 64;
  ok.dst = reinterpret_cast<std::byte*>(fake + 64);
  ok.dst_bytes = 64;
  ok.extents = pairs;
  ok.num_extents = 0;
  ok.total_words = 0;
  ok.checksum = &sum;
  ok.bad_extent = &bad;
  // No extents: nothing to launch.
  EXPECT_EQ(KvExtentCopy(ok, nullptr), cudaSuccess);
  KvExtentCopyParams no_list = ok;
  no_list.extents = nullptr;
  EXPECT_EQ(KvExtentCopy(no_list, nullptr), cudaSuccess);
  KvExtentCopyParams sum_only = ok;  // without a destination its alignment does not matter
  sum_only.dst = nullptr;
  sum_only.bad_extent = nullptr;
  EXPECT_EQ(KvExtentCopy(sum_only, nullptr), cudaSuccess);
  KvExtentCopyParams copy_only = ok;
  copy_only.checksum = nullptr;
  EXPECT_EQ(KvExtentCopy(copy_only, nullptr), cudaSuccess);

  struct Bad {
    const char* what;
    void (*mutate)(KvExtentCopyParams&);
  };
  const Bad bad_params[] = {
      {"null src", [](KvExtentCopyParams& p) { p.src = nullptr; }},
      {"misaligned src", [](KvExtentCopyParams& p) { p.src = reinterpret_cast<const std::byte*>(fake + 4); }},
      {"misaligned dst", [](KvExtentCopyParams& p) { p.dst = reinterpret_cast<std::byte*>(fake + 66); }},
      {"null extents", [](KvExtentCopyParams& p) { p.extents = nullptr, p.num_extents = 2; }},
      {"negative num_extents", [](KvExtentCopyParams& p) { p.num_extents = -1; }},
      {"total_words 2^48", [](KvExtentCopyParams& p) { p.total_words = uint64_t{1} << 48; }},
      {"total_words huge", [](KvExtentCopyParams& p) { p.total_words = std::numeric_limits<uint64_t>::max(); }},
      {"nothing to do", [](KvExtentCopyParams& p) { p.dst = nullptr, p.checksum = nullptr; }},
  };
  for (const Bad& b : bad_params) {
    for (int64_t n : {0, 2}) {
      KvExtentCopyParams p = ok;
      p.num_extents = n;
      p.total_words = 8;
      b.mutate(p);
      EXPECT_EQ(KvExtentCopy(p, nullptr), cudaErrorInvalidValue) << b.what << ", " << n << " extents";
    }
  }
}

class CudaKvExtentCopyTest : public testing::GpuTest {
 protected:
  // One call's device state: the pools, the list, the checksum and the flag (zeroed).
  struct Run {
    Run(const Bytes& src_bytes, const Bytes& dst_bytes, const std::vector<KvExtentPair>& list)
        : src(src_bytes), dst(dst_bytes), extents(list), sum(std::vector<unsigned long long>{0}),
          bad(std::vector<int32_t>{0}) {
      p.src = reinterpret_cast<const std::byte*>(src.get());
      p.src_bytes = src_bytes.size();
      p.dst = reinterpret_cast<std::byte*>(dst.get());
      p.dst_bytes = dst_bytes.size();
      p.extents = extents.get();
      p.num_extents = static_cast<int64_t>(list.size());
      uint64_t words = 0;  // a bad extent's claim may exceed the limit: declare less
      for (const KvExtentPair& e : list) words += e.bytes / 8;
      p.total_words = std::min(words, (uint64_t{1} << 48) - 1);
      p.checksum = sum.get();
      p.bad_extent = bad.get();
    }
    uint64_t Sum() const { return sum.Download()[0]; }
    int32_t Bad() const { return bad.Download()[0]; }
    void Reset() {
      sum.Upload({0});
      bad.Upload({0});
    }
    Dev<unsigned char> src, dst;
    Dev<KvExtentPair> extents;
    Dev<unsigned long long> sum;
    Dev<int32_t> bad;
    KvExtentCopyParams p;
  };

  // Copies with and without the checksum, then checksums the source and the destination
  // alone; all must agree with the host reference, with nothing flagged. `total_words`,
  // when given, replaces the true count (it only sizes the launch).
  static void Check(const Bytes& src, const Bytes& dst_before, const std::vector<KvExtentPair>& extents,
                    bool programmatic_launch, const uint64_t* total_words = nullptr) {
    SCOPED_TRACE(std::to_string(extents.size()) + " extents" + (programmatic_launch ? ", PDL" : ""));
    cuda::ScopedProgrammaticLaunch pdl(programmatic_launch);
    testing::DevStream stream;
    const Bytes expected = CopiedOnHost(src, dst_before, extents);
    const uint64_t expected_sum = Checksum(src, extents);
    ASSERT_EQ(Checksum(expected, DestinationSide(extents)), expected_sum);  // the reference agrees with itself

    Run r(src, dst_before, extents);
    if (total_words != nullptr) r.p.total_words = *total_words;
    ASSERT_EQ(KvExtentCopy(r.p, stream.get()), cudaSuccess);
    EXPECT_EQ(FirstDifference(expected, r.dst.Download()), "");
    EXPECT_EQ(r.Sum(), expected_sum);
    EXPECT_EQ(r.Bad(), 0);

    // Without the checksum, into a fresh destination.
    r.dst.Upload(dst_before);
    r.Reset();
    KvExtentCopyParams no_sum = r.p;
    no_sum.checksum = nullptr;
    ASSERT_EQ(KvExtentCopy(no_sum, stream.get()), cudaSuccess);
    EXPECT_EQ(FirstDifference(expected, r.dst.Download()), "");
    EXPECT_EQ(r.Sum(), 0u);

    // Checksum only, over the source.
    KvExtentCopyParams src_only = r.p;
    src_only.dst = nullptr;
    ASSERT_EQ(KvExtentCopy(src_only, stream.get()), cudaSuccess);
    EXPECT_EQ(r.Sum(), expected_sum);
    EXPECT_EQ(r.Bad(), 0);

    // The receiver's check: its own list, read at the destination; destination offsets
    // it does not use may be anything.
    std::vector<KvExtentPair> receiver = DestinationSide(extents);
    for (KvExtentPair& e : receiver) e.dst_offset = 3;
    Run check(r.dst.Download(), {}, receiver);
    check.p.dst = nullptr;
    if (total_words != nullptr) check.p.total_words = *total_words;
    ASSERT_EQ(KvExtentCopy(check.p, stream.get()), cudaSuccess);
    EXPECT_EQ(check.Sum(), expected_sum);
    EXPECT_EQ(check.Bad(), 0);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
};

TEST_F(CudaKvExtentCopyTest, MatchesTheHostReference) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    std::mt19937_64 rng(seed);
    const Bytes src = RandomBytes(1 << 20, rng());
    uint64_t dst_bytes = 0;
    const std::vector<KvExtentPair> extents = RandomExtents(50, src.size(), rng, &dst_bytes);
    Check(src, Pattern(dst_bytes), extents, seed % 2 == 0);
    if (HasFatalFailure()) return;
  }
}

// A few extents of megabytes: chunks of every extent spread over many warps, each warp
// taking several of one extent. And a wrong total_words (too small, too large) changes
// only how the work is cut.
TEST_F(CudaKvExtentCopyTest, LargeExtents) {
  std::mt19937_64 rng(5);
  const Bytes src = RandomBytes(48 << 20, rng());
  std::vector<KvExtentPair> extents = {{.src_offset = 8, .dst_offset = 24, .bytes = (20 << 20) + 8, .layer = 0},
                                       {.src_offset = 24 << 20, .dst_offset = 40 << 20, .bytes = 8 << 20, .layer = 1},
                                       {.src_offset = 40, .dst_offset = 30 << 20, .bytes = 9 << 20, .layer = 2},
                                       {.src_offset = 0, .dst_offset = (52 << 20) + 8, .bytes = 0, .layer = 3},
                                       {.src_offset = 1 << 20, .dst_offset = 21 << 20, .bytes = 88, .layer = 3}};
  NumberKvExtentWords(extents);
  const Bytes dst_before = Pattern((52 << 20) + 64);
  Check(src, dst_before, extents, false);
  if (HasFatalFailure()) return;
  Check(src, dst_before, extents, true);
  if (HasFatalFailure()) return;
  for (uint64_t declared : {uint64_t{0}, uint64_t{1}, (uint64_t{1} << 48) - 1}) {
    SCOPED_TRACE("declared total_words " + std::to_string(declared));
    Check(src, dst_before, extents, false, &declared);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaKvExtentCopyTest, EmptyExtents) {
  const Bytes src = RandomBytes(64, 6);
  std::vector<KvExtentPair> extents = {{.src_offset = 0, .dst_offset = 0}, {.src_offset = 64, .dst_offset = 64}};
  NumberKvExtentWords(extents);
  Run r(src, Pattern(64), extents);
  ASSERT_EQ(KvExtentCopy(r.p, nullptr), cudaSuccess);
  EXPECT_EQ(FirstDifference(Pattern(64), r.dst.Download()), "");
  EXPECT_EQ(r.Sum(), 0u);
  EXPECT_EQ(r.Bad(), 0);
}

// What the receiver's checksum catches in its pool: a changed byte, two equal-size
// extents' layers swapped (in the receiver's list), a word moved.
TEST_F(CudaKvExtentCopyTest, ChecksumCatchesCorruption) {
  std::mt19937_64 rng(7);
  const Bytes src = RandomBytes(1 << 20, rng());
  uint64_t dst_bytes = 0;
  std::vector<KvExtentPair> extents = RandomExtents(50, src.size(), rng, &dst_bytes);
  extents[5].bytes = extents[8].bytes = 4096;  // equal sizes, different layers, placed apart
  extents[5].layer = 1;
  extents[8].layer = 2;
  extents[5].dst_offset = dst_bytes;
  extents[8].dst_offset = dst_bytes + 8192;
  NumberKvExtentWords(extents);
  const Bytes pool = CopiedOnHost(src, Pattern(dst_bytes + 16384), extents);
  const std::vector<KvExtentPair> receiver = DestinationSide(extents);
  const uint64_t expected = Checksum(src, extents);
  auto device_sum = [&](const Bytes& bytes, const std::vector<KvExtentPair>& list) {
    Run r(bytes, {}, list);
    r.p.dst = nullptr;
    EXPECT_EQ(KvExtentCopy(r.p, nullptr), cudaSuccess);
    EXPECT_EQ(r.Bad(), 0);
    return r.Sum();
  };
  ASSERT_EQ(device_sum(pool, receiver), expected);

  Bytes changed = pool;
  changed[extents[7].dst_offset + 100003] ^= 0x10;
  EXPECT_NE(device_sum(changed, receiver), expected);

  std::vector<KvExtentPair> swapped = receiver;
  std::swap(swapped[5].layer, swapped[8].layer);
  EXPECT_NE(device_sum(pool, swapped), expected);

  Bytes moved = pool;  // word 3 of extent 7 moved to word 900, the words between moving down
  const uint64_t at = extents[7].dst_offset;
  std::rotate(moved.begin() + at + 24, moved.begin() + at + 32, moved.begin() + at + 908 * 8);
  EXPECT_NE(device_sum(moved, receiver), expected);

  ASSERT_EQ(device_sum(pool, receiver), expected);  // and back
}

// Each kind of bad extent, among good ones: flagged, neither copied nor summed, the others
// copied and summed. Without a destination, only the source side can be bad.
TEST_F(CudaKvExtentCopyTest, BadExtentsAreSkipped) {
  std::mt19937_64 rng(9);
  const Bytes src = RandomBytes(1 << 20, rng());
  uint64_t dst_bytes = 0;
  std::vector<KvExtentPair> good = RandomExtents(30, src.size(), rng, &dst_bytes);
  const uint64_t spare = dst_bytes;  // bad extents' destination ranges, after the good ones'
  dst_bytes += 4096;
  const uint64_t u64_max = std::numeric_limits<uint64_t>::max();
  struct Bad {
    const char* what;
    KvExtentPair e;
    bool bad_without_dst;
  };
  const Bad bad[] = {
      {"source beyond the pool", {.src_offset = src.size() - 8, .dst_offset = spare, .bytes = 16}, true},
      {"source offset overflows", {.src_offset = u64_max - 7, .dst_offset = spare, .bytes = 16}, true},
      {"bytes overflow", {.src_offset = 8, .dst_offset = spare, .bytes = u64_max - 7}, true},
      {"source misaligned", {.src_offset = 4, .dst_offset = spare, .bytes = 16}, true},
      {"bytes not a multiple of 8", {.src_offset = 0, .dst_offset = spare + 64, .bytes = 12}, true},
      {"layer 2^16", {.src_offset = 64, .dst_offset = spare + 128, .bytes = 64, .layer = 1 << 16}, true},
      {"negative layer", {.src_offset = 64, .dst_offset = spare + 256, .bytes = 64, .layer = -1}, true},
      {"destination beyond the pool", {.src_offset = 0, .dst_offset = dst_bytes - 8, .bytes = 16}, false},
      {"destination offset overflows", {.src_offset = 0, .dst_offset = u64_max - 7, .bytes = 16}, false},
      {"destination misaligned", {.src_offset = 0, .dst_offset = spare + 516, .bytes = 16}, false},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    std::vector<KvExtentPair> list = good;
    const size_t at = rng() % (list.size() + 1);
    list.insert(list.begin() + static_cast<std::ptrdiff_t>(at), b.e);
    NumberKvExtentWords(list);
    std::vector<KvExtentPair> valid = list;
    valid.erase(valid.begin() + static_cast<std::ptrdiff_t>(at));
    const Bytes dst_before = Pattern(dst_bytes);

    Run r(src, dst_before, list);
    ASSERT_EQ(KvExtentCopy(r.p, nullptr), cudaSuccess);
    EXPECT_EQ(FirstDifference(CopiedOnHost(src, dst_before, valid), r.dst.Download()), "");
    EXPECT_EQ(r.Sum(), Checksum(src, valid));
    EXPECT_EQ(r.Bad(), 1);

    r.Reset();
    KvExtentCopyParams sum_only = r.p;
    sum_only.dst = nullptr;
    ASSERT_EQ(KvExtentCopy(sum_only, nullptr), cudaSuccess);
    EXPECT_EQ(r.Sum(), Checksum(src, b.bad_without_dst ? valid : list));
    EXPECT_EQ(r.Bad(), b.bad_without_dst ? 1 : 0);

    r.Reset();  // without a flag to set, the same skip
    KvExtentCopyParams no_flag = r.p;
    no_flag.bad_extent = nullptr;
    ASSERT_EQ(KvExtentCopy(no_flag, nullptr), cudaSuccess);
    EXPECT_EQ(r.Sum(), Checksum(src, valid));
    EXPECT_EQ(r.Bad(), 0);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace tandem
