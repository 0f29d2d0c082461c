// KvBlockCopy (kernels/cuda/kv_block_copy.h) against a host reference copy over a grid of
// shapes: the destination pool equals the reference byte for byte (entries outside the
// copied range keep their sentinel), and the device checksum equals the sum of
// KvEntryChecksum over the copied entries, whether computed while copying, in
// checksum-only mode over the source, or over the destination with its own block table.
// Exact comparisons throughout: the kernel moves bytes and sums integers. GPU cases skip,
// saying why, where no GPU is usable; the host-only cases (the documented formula,
// parameter checks) run everywhere.
#include "kernels/cuda/kv_block_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/launch_control.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using cuda::KvBlockCopy;
using cuda::KvBlockCopyParams;
using cuda::KvEntryChecksum;

constexpr unsigned char kSentinel = 0x5a;

// The header's formula, written out independently of the library.
uint64_t Splitmix64Finalizer(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t DocumentedEntryChecksum(uint64_t layer, uint64_t position, const unsigned char* entry, int64_t bytes) {
  const uint64_t golden = 0x9e3779b97f4a7c15ull;
  const uint64_t seed = Splitmix64Finalizer((layer << 48) ^ position ^ golden);
  uint64_t sum = 0;
  for (int64_t w = 0; w < bytes / 8; ++w) {
    uint64_t x = 0;
    for (int b = 7; b >= 0; --b) x = (x << 8) | entry[8 * w + b];  // little-endian
    sum += Splitmix64Finalizer(x ^ (seed + (static_cast<uint64_t>(w) + 1) * golden));
  }
  return sum;
}

std::vector<unsigned char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

TEST(KvEntryChecksumTest, MatchesTheDocumentedFormula) {
  for (int64_t bytes : {8, 16, 1152, 4104}) {
    for (int64_t layer : {0, 1, 26, 60, 65535}) {
      for (int64_t position : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{4096}, (int64_t{1} << 48) - 1}) {
        const std::vector<unsigned char> e = RandomBytes(bytes, bytes * 7 + layer * 131 + position);
        EXPECT_EQ(KvEntryChecksum(layer, position, e.data(), bytes), DocumentedEntryChecksum(layer, position, e.data(), bytes))
            << bytes << " bytes, layer " << layer << ", position " << position;
      }
    }
  }
  const std::vector<unsigned char> zeros(1152, 0);
  EXPECT_NE(KvEntryChecksum(0, 0, zeros.data(), 1152), 0u);  // a zero entry still counts
}

TEST(KvEntryChecksumTest, DependsOnBytesPositionAndLayer) {
  const std::vector<unsigned char> a = RandomBytes(1152, 1), b = RandomBytes(1152, 2);
  const uint64_t base = KvEntryChecksum(3, 100, a.data(), 1152) + KvEntryChecksum(3, 101, b.data(), 1152);
  // A changed byte, anywhere.
  for (size_t at : {size_t{0}, size_t{7}, size_t{8}, size_t{577}, size_t{1151}}) {
    std::vector<unsigned char> c = a;
    c[at] ^= 0x01;
    EXPECT_NE(KvEntryChecksum(3, 100, c.data(), 1152) + KvEntryChecksum(3, 101, b.data(), 1152), base) << at;
  }
  // Two positions swapped; two layers swapped.
  EXPECT_NE(KvEntryChecksum(3, 100, b.data(), 1152) + KvEntryChecksum(3, 101, a.data(), 1152), base);
  EXPECT_NE(KvEntryChecksum(3, 100, a.data(), 1152) + KvEntryChecksum(4, 100, b.data(), 1152),
            KvEntryChecksum(4, 100, a.data(), 1152) + KvEntryChecksum(3, 100, b.data(), 1152));
  // Two words swapped inside an entry.
  std::vector<unsigned char> s = a;
  std::swap_ranges(s.begin(), s.begin() + 8, s.begin() + 8);
  EXPECT_NE(KvEntryChecksum(3, 100, s.data(), 1152), KvEntryChecksum(3, 100, a.data(), 1152));
}

// Host-only: every bad parameter set is refused before anything touches the device (the
// pointers below are never dereferenced).
TEST(KvBlockCopyParamsTest, InvalidParamsAreRefused) {
  alignas(16) static unsigned char fake[64];
  static int32_t table[4];
  static unsigned long long sum;
  KvBlockCopyParams ok;
  ok.src = fake;
  ok.dst = fake + 32;
  ok.src_num_blocks = 4;
  ok.dst_num_blocks = 4;
  ok.block_size = 64;
  ok.entry_bytes = 1152;
  ok.layer_begin = 0;
  ok.layer_end = 2;
  ok.src_blocks = table;
  ok.dst_blocks = table;
  ok.begin = 3;
  ok.end = 3;  // empty: a valid call that launches nothing
  ok.checksum = &sum;
  ASSERT_EQ(KvBlockCopy(ok, nullptr), cudaSuccess);
  KvBlockCopyParams empty_layers = ok;
  empty_layers.end = 100;
  empty_layers.layer_end = 0;
  ASSERT_EQ(KvBlockCopy(empty_layers, nullptr), cudaSuccess);

  struct Bad {
    const char* what;
    void (*mutate)(KvBlockCopyParams&);
  };
  const Bad bad[] = {
      {"entry_bytes not a multiple of 16", [](KvBlockCopyParams& p) { p.entry_bytes = 1144; }},
      {"entry_bytes 8", [](KvBlockCopyParams& p) { p.entry_bytes = 8; }},
      {"entry_bytes 0", [](KvBlockCopyParams& p) { p.entry_bytes = 0; }},
      {"entry_bytes negative", [](KvBlockCopyParams& p) { p.entry_bytes = -16; }},
      {"block_size 0", [](KvBlockCopyParams& p) { p.block_size = 0; }},
      {"block_size negative", [](KvBlockCopyParams& p) { p.block_size = -64; }},
      {"end < begin", [](KvBlockCopyParams& p) { p.end = 2; }},
      {"negative begin", [](KvBlockCopyParams& p) { p.begin = -1; }},
      {"end beyond 2^48", [](KvBlockCopyParams& p) { p.end = (int64_t{1} << 48) + 1; }},
      {"layer_end < layer_begin", [](KvBlockCopyParams& p) { p.layer_begin = 2, p.layer_end = 1; }},
      {"negative layer_begin", [](KvBlockCopyParams& p) { p.layer_begin = -1; }},
      {"layer_end beyond 2^16", [](KvBlockCopyParams& p) { p.layer_end = (int64_t{1} << 16) + 1; }},
      {"null src", [](KvBlockCopyParams& p) { p.src = nullptr; }},
      {"misaligned src", [](KvBlockCopyParams& p) { p.src = fake + 8; }},
      {"misaligned dst", [](KvBlockCopyParams& p) { p.dst = fake + 4; }},
      {"null src table", [](KvBlockCopyParams& p) { p.src_blocks = nullptr; }},
      {"null dst table", [](KvBlockCopyParams& p) { p.dst_blocks = nullptr; }},
      {"no source blocks", [](KvBlockCopyParams& p) { p.src_num_blocks = 0; }},
      {"no destination blocks", [](KvBlockCopyParams& p) { p.dst_num_blocks = 0; }},
      {"nothing to do", [](KvBlockCopyParams& p) { p.dst = nullptr, p.checksum = nullptr; }},
  };
  for (const Bad& b : bad) {
    for (int64_t end : {int64_t{3}, int64_t{100}}) {  // empty and non-empty ranges alike
      KvBlockCopyParams p = ok;
      p.end = end;
      b.mutate(p);
      EXPECT_EQ(KvBlockCopy(p, nullptr), cudaErrorInvalidValue) << b.what << ", end " << end;
    }
  }
  // Without a destination its table and size do not matter.
  KvBlockCopyParams sum_only = ok;
  sum_only.dst = nullptr;
  sum_only.dst_blocks = nullptr;
  sum_only.dst_num_blocks = 0;
  EXPECT_EQ(KvBlockCopy(sum_only, nullptr), cudaSuccess);
}

// A device allocation freed on destruction.
class DevBytes {
 public:
  explicit DevBytes(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 16)), cudaSuccess); }
  ~DevBytes() { cudaFree(p_); }
  DevBytes(const DevBytes&) = delete;
  DevBytes& operator=(const DevBytes&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  void Upload(const void* data, size_t n) { ASSERT_EQ(cudaMemcpy(p_, data, n, cudaMemcpyHostToDevice), cudaSuccess); }
  template <typename T>
  void Upload(const std::vector<T>& v) {
    Upload(v.data(), v.size() * sizeof(T));
  }
  std::vector<unsigned char> Download() const {
    std::vector<unsigned char> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  uint64_t Word() const {
    uint64_t v = 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&v, p_, 8, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void Zero() { ASSERT_EQ(cudaMemset(p_, 0, n_), cudaSuccess); }

 private:
  void* p_ = nullptr;
  size_t n_;
};

struct Shape {
  int64_t pool_layers, entry_bytes, block_size;
  int64_t layer_begin, layer_end, begin, end;
};

std::string Describe(const Shape& s) {
  return "layers " + std::to_string(s.layer_begin) + ".." + std::to_string(s.layer_end) + " of " +
         std::to_string(s.pool_layers) + ", entry " + std::to_string(s.entry_bytes) + " B, block " +
         std::to_string(s.block_size) + ", positions " + std::to_string(s.begin) + ".." + std::to_string(s.end);
}

// A paged pool on the host: [layer][block][slot][entry_bytes].
struct HostPool {
  int64_t layers, blocks, block_size, entry_bytes;
  std::vector<unsigned char> bytes;
  size_t Offset(int64_t layer, int64_t block, int64_t slot) const {
    return static_cast<size_t>(((layer * blocks + block) * block_size + slot) * entry_bytes);
  }
  unsigned char* Entry(int64_t layer, const std::vector<int32_t>& table, int64_t position) {
    return bytes.data() + Offset(layer, table[position / block_size], position % block_size);
  }
};

// Distinct random block ids for table indices [first, count); -1 before `first` (the
// kernel must not read those).
std::vector<int32_t> RandomTable(int64_t first, int64_t count, int64_t pool_blocks, std::mt19937_64& rng) {
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(count, -1);
  for (int64_t i = first; i < count; ++i) table[i] = ids[i - first];
  return table;
}

class CudaKvBlockCopyTest : public testing::GpuTest {
 protected:
  // Everything for one shape: pools, tables, the reference.
  struct Case {
    Shape s;
    HostPool src, dst_before, expected;
    std::vector<int32_t> src_table, dst_table;
    uint64_t expected_sum = 0;
  };

  static Case MakeCase(const Shape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Case c;
    c.s = s;
    const int64_t first = s.begin / s.block_size;
    const int64_t count = (s.end + s.block_size - 1) / s.block_size;
    const int64_t spanned = std::max<int64_t>(count - first, 1);
    const int64_t src_blocks = spanned + 1 + static_cast<int64_t>(rng() % 5);
    const int64_t dst_blocks = spanned + 1 + static_cast<int64_t>(rng() % 5);
    c.src = {s.pool_layers, src_blocks, s.block_size, s.entry_bytes, {}};
    c.src.bytes = RandomBytes(static_cast<size_t>(s.pool_layers * src_blocks * s.block_size * s.entry_bytes), rng());
    c.dst_before = {s.pool_layers, dst_blocks, s.block_size, s.entry_bytes, {}};
    c.dst_before.bytes.assign(static_cast<size_t>(s.pool_layers * dst_blocks * s.block_size * s.entry_bytes), kSentinel);
    c.src_table = RandomTable(first, count, src_blocks, rng);
    c.dst_table = RandomTable(first, count, dst_blocks, rng);
    c.expected = c.dst_before;
    for (int64_t l = s.layer_begin; l < s.layer_end; ++l) {
      for (int64_t p = s.begin; p < s.end; ++p) {
        const unsigned char* e = c.src.Entry(l, c.src_table, p);
        std::memcpy(c.expected.Entry(l, c.dst_table, p), e, s.entry_bytes);
        c.expected_sum += KvEntryChecksum(l, p, e, s.entry_bytes);
      }
    }
    return c;
  }

  // Finds the first differing entry and says where it is.
  static std::string FirstDifference(const HostPool& want, const std::vector<unsigned char>& got) {
    if (got.size() != want.bytes.size()) return "size differs";
    const auto m = std::mismatch(want.bytes.begin(), want.bytes.end(), got.begin());
    if (m.first == want.bytes.end()) return "";
    const int64_t at = m.first - want.bytes.begin();
    const int64_t entry = at / want.entry_bytes;
    const int64_t slot = entry % want.block_size, block = entry / want.block_size % want.blocks,
                  layer = entry / want.block_size / want.blocks;
    return "byte " + std::to_string(at) + " (layer " + std::to_string(layer) + ", block " + std::to_string(block) +
           ", slot " + std::to_string(slot) + ", byte " + std::to_string(at % want.entry_bytes) + "): got " +
           std::to_string(*m.second) + ", want " + std::to_string(*m.first);
  }

  // Copies with and without the checksum, then checksums the source and the destination
  // alone; everything must agree with the reference.
  static void Check(const Shape& s, uint64_t seed, bool programmatic_launch) {
    SCOPED_TRACE(Describe(s) + (programmatic_launch ? ", PDL" : ""));
    cuda::ScopedProgrammaticLaunch pdl(programmatic_launch);
    testing::DevStream stream;  // a blocking stream: ordered after the uploads on the default stream
    const Case c = MakeCase(s, seed);
    DevBytes src(c.src.bytes.size()), dst(c.dst_before.bytes.size()), sum(8);
    DevBytes src_table(c.src_table.size() * 4), dst_table(c.dst_table.size() * 4);
    src.Upload(c.src.bytes);
    dst.Upload(c.dst_before.bytes);
    src_table.Upload(c.src_table);
    dst_table.Upload(c.dst_table);
    sum.Zero();
    KvBlockCopyParams p;
    p.src = src.get();
    p.dst = dst.get();
    p.src_num_blocks = c.src.blocks;
    p.dst_num_blocks = c.dst_before.blocks;
    p.block_size = s.block_size;
    p.entry_bytes = s.entry_bytes;
    p.layer_begin = s.layer_begin;
    p.layer_end = s.layer_end;
    p.src_blocks = src_table.get<int32_t>();
    p.dst_blocks = dst_table.get<int32_t>();
    p.begin = s.begin;
    p.end = s.end;
    p.checksum = sum.get<unsigned long long>();
    ASSERT_EQ(KvBlockCopy(p, stream.get()), cudaSuccess);
    EXPECT_EQ(FirstDifference(c.expected, dst.Download()), "");
    EXPECT_EQ(sum.Word(), c.expected_sum);

    // Without the checksum, into a fresh destination.
    dst.Upload(c.dst_before.bytes);
    KvBlockCopyParams no_sum = p;
    no_sum.checksum = nullptr;
    ASSERT_EQ(KvBlockCopy(no_sum, stream.get()), cudaSuccess);
    EXPECT_EQ(FirstDifference(c.expected, dst.Download()), "");

    // Checksum only, over the source; then over the destination with its own table (the
    // receiver's check), one layer per call (sums add up).
    sum.Zero();
    KvBlockCopyParams src_only = p;
    src_only.dst = nullptr;
    src_only.dst_blocks = nullptr;
    ASSERT_EQ(KvBlockCopy(src_only, stream.get()), cudaSuccess);
    EXPECT_EQ(sum.Word(), c.expected_sum);
    sum.Zero();
    for (int64_t l = s.layer_begin; l < s.layer_end; ++l) {
      KvBlockCopyParams dst_only = src_only;
      dst_only.src = dst.get();
      dst_only.src_num_blocks = c.dst_before.blocks;
      dst_only.src_blocks = dst_table.get<int32_t>();
      dst_only.layer_begin = l;
      dst_only.layer_end = l + 1;
      ASSERT_EQ(KvBlockCopy(dst_only, stream.get()), cudaSuccess);
    }
    EXPECT_EQ(sum.Word(), c.expected_sum);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
};

TEST_F(CudaKvBlockCopyTest, MatchesTheHostReferenceOverShapes) {
  uint64_t seed = 1;
  int n = 0;
  for (int64_t block_size : {16, 64}) {
    for (int64_t entry_bytes : {16, 48, 1152, 4112}) {
      const int64_t bs = block_size;
      const std::pair<int64_t, int64_t> ranges[] = {
          {0, 1}, {0, bs}, {3, 2 * bs + 5}, {bs - 1, bs + 1}, {bs, 3 * bs}, {17, 11 * bs + 3}, {5 * bs + 2, 5 * bs + 3}};
      for (auto [begin, end] : ranges) {
        for (auto [pool_layers, layer_begin, layer_end] :
             {std::tuple<int64_t, int64_t, int64_t>{1, 0, 1}, {3, 0, 3}, {4, 1, 3}}) {
          Check({pool_layers, entry_bytes, block_size, layer_begin, layer_end, begin, end}, seed++, (n++ % 3) == 1);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The real geometry (DeepSeek's 576 bf16 latent entries, 64-slot blocks), large enough
// that the grid strides over more tiles than it has warps.
TEST_F(CudaKvBlockCopyTest, RealGeometry) {
  Check({61, 1152, 64, 3, 58, 5, 250}, 101, false);
  Check({27, 1152, 64, 0, 27, 37, 2085}, 102, false);
  Check({27, 1152, 64, 0, 27, 0, 4096}, 103, true);
}

// One call over all layers and one call per layer add up to the same checksum; a second
// copy adds the same amount again.
TEST_F(CudaKvBlockCopyTest, ChecksumsAddUp) {
  const Shape s{5, 1152, 64, 0, 5, 10, 300};
  const Case c = MakeCase(s, 7);
  DevBytes src(c.src.bytes.size()), dst(c.dst_before.bytes.size()), sum(8);
  DevBytes src_table(c.src_table.size() * 4), dst_table(c.dst_table.size() * 4);
  src.Upload(c.src.bytes);
  src_table.Upload(c.src_table);
  dst_table.Upload(c.dst_table);
  sum.Zero();
  KvBlockCopyParams p{.src = src.get(), .dst = dst.get(), .src_num_blocks = c.src.blocks,
                      .dst_num_blocks = c.dst_before.blocks, .block_size = 64, .entry_bytes = 1152,
                      .layer_begin = 0, .layer_end = 5, .src_blocks = src_table.get<int32_t>(),
                      .dst_blocks = dst_table.get<int32_t>(), .begin = 10, .end = 300,
                      .checksum = sum.get<unsigned long long>()};
  for (int64_t l = 0; l < 5; ++l) {
    KvBlockCopyParams one = p;
    one.layer_begin = l;
    one.layer_end = l + 1;
    ASSERT_EQ(KvBlockCopy(one, nullptr), cudaSuccess);
  }
  EXPECT_EQ(sum.Word(), c.expected_sum);
  ASSERT_EQ(KvBlockCopy(p, nullptr), cudaSuccess);
  EXPECT_EQ(sum.Word(), 2 * c.expected_sum);
  // Positions split at an arbitrary point add up too.
  sum.Zero();
  for (auto [b, e] : {std::pair<int64_t, int64_t>{10, 77}, {77, 300}}) {
    KvBlockCopyParams part = p;
    part.begin = b;
    part.end = e;
    ASSERT_EQ(KvBlockCopy(part, nullptr), cudaSuccess);
  }
  EXPECT_EQ(sum.Word(), c.expected_sum);
}

// What the receiver's checksum catches in its pool: a changed byte, two positions'
// entries swapped, two layers swapped.
TEST_F(CudaKvBlockCopyTest, ChecksumCatchesCorruption) {
  const Shape s{4, 1152, 16, 0, 4, 3, 70};
  const Case c = MakeCase(s, 11);
  HostPool pool = c.expected;  // the destination after a correct copy
  DevBytes dev(pool.bytes.size()), sum(8), table(c.dst_table.size() * 4);
  table.Upload(c.dst_table);
  KvBlockCopyParams p{.src = dev.get(), .src_num_blocks = pool.blocks, .block_size = 16, .entry_bytes = 1152,
                      .layer_begin = 0, .layer_end = 4, .src_blocks = table.get<int32_t>(), .begin = 3, .end = 70,
                      .checksum = sum.get<unsigned long long>()};
  auto device_sum = [&](const HostPool& h) {
    dev.Upload(h.bytes);
    sum.Zero();
    EXPECT_EQ(KvBlockCopy(p, nullptr), cudaSuccess);
    return sum.Word();
  };
  ASSERT_EQ(device_sum(pool), c.expected_sum);

  HostPool changed = pool;
  changed.Entry(2, c.dst_table, 40)[1000] ^= 0x80;
  EXPECT_NE(device_sum(changed), c.expected_sum);

  HostPool swapped = pool;  // positions 10 and 50 of layer 1 (different blocks)
  std::swap_ranges(swapped.Entry(1, c.dst_table, 10), swapped.Entry(1, c.dst_table, 10) + 1152,
                   swapped.Entry(1, c.dst_table, 50));
  EXPECT_NE(device_sum(swapped), c.expected_sum);

  HostPool layers = pool;  // layers 0 and 3, whole
  const size_t layer_bytes = layers.Offset(1, 0, 0);
  std::swap_ranges(layers.bytes.begin(), layers.bytes.begin() + layer_bytes,
                   layers.bytes.begin() + 3 * layer_bytes);
  EXPECT_NE(device_sum(layers), c.expected_sum);

  ASSERT_EQ(device_sum(pool), c.expected_sum);  // and back
}

// A block id outside the pool is skipped (nothing written out of bounds; its entries are
// missing from the checksum, so the receiver notices).
TEST_F(CudaKvBlockCopyTest, OutOfRangeBlockIdsAreSkipped) {
  const Shape s{2, 1152, 64, 0, 2, 0, 256};
  Case c = MakeCase(s, 13);
  std::vector<int32_t> bad_dst = c.dst_table;
  bad_dst[1] = static_cast<int32_t>(c.dst_before.blocks);  // positions 64..127
  std::vector<int32_t> bad_src = c.src_table;
  bad_src[3] = -5;  // positions 192..255
  HostPool expected = c.dst_before;
  uint64_t expected_sum = 0;
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t pos = 0; pos < 256; ++pos) {
      if (pos / 64 == 1 || pos / 64 == 3) continue;
      const unsigned char* e = c.src.Entry(l, c.src_table, pos);
      std::memcpy(expected.Entry(l, c.dst_table, pos), e, 1152);
      expected_sum += KvEntryChecksum(l, pos, e, 1152);
    }
  }
  DevBytes src(c.src.bytes.size()), dst(c.dst_before.bytes.size()), sum(8);
  DevBytes src_table(bad_src.size() * 4), dst_table(bad_dst.size() * 4);
  src.Upload(c.src.bytes);
  dst.Upload(c.dst_before.bytes);
  src_table.Upload(bad_src);
  dst_table.Upload(bad_dst);
  sum.Zero();
  ASSERT_EQ(KvBlockCopy({.src = src.get(), .dst = dst.get(), .src_num_blocks = c.src.blocks,
                         .dst_num_blocks = c.dst_before.blocks, .block_size = 64, .entry_bytes = 1152,
                         .layer_begin = 0, .layer_end = 2, .src_blocks = src_table.get<int32_t>(),
                         .dst_blocks = dst_table.get<int32_t>(), .begin = 0, .end = 256,
                         .checksum = sum.get<unsigned long long>()},
                        nullptr),
            cudaSuccess);
  EXPECT_EQ(FirstDifference(expected, dst.Download()), "");
  EXPECT_EQ(sum.Word(), expected_sum);
}

}  // namespace
}  // namespace tandem
