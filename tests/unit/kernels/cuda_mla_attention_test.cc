// GPU MLA attention (paged decode, absorbed form; causal prefill, expanded form) and the
// KV cache write, against the CPU reference kernels (kernels/cpu/mla_attention.h) over
// grids of shapes. Skips, saying why, where no GPU is usable.
//
// Inputs are bf16 on the GPU; the CPU reference gets the same values as floats (the
// bf16-rounded inputs), so only accumulation order and the kernels' bf16 rounding of the
// softmax probabilities (2^-9 relative, before the P·V tensor-core product) differ.
// Tolerance: per output row, ||gpu - ref|| / ||ref|| <= 1e-2, the usual bound for bf16
// operands; the probability rounding alone gives errors of order 2^-9.
//
// TANDEM_MLA_TEST_QUICK=1 selects a reduced grid (for compute-sanitizer memcheck, which
// runs the kernels tens of times slower).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/mla_decode_attention.h"
#include "kernels/cuda/mla_prefill_attention.h"

namespace tandem {
namespace {

constexpr double kTolerance = 1e-2;

bool QuickMode() {
  const char* v = std::getenv("TANDEM_MLA_TEST_QUICK");
  return v != nullptr && std::string(v) != "0" && std::string(v) != "";
}

// Device memory owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  template <typename T>
  void Upload(const std::vector<T>& v) {
    ASSERT_EQ(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T>
  std::vector<T> Download(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Random bf16 values: `bits` for the GPU, `values` (the same numbers) for the CPU.
struct Bf16Array {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Bf16Array RandomBf16(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  Bf16Array a;
  a.bits.resize(n);
  a.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    a.bits[i] = F32ToBf16(dist(rng));
    a.values[i] = Bf16ToF32(a.bits[i]);
  }
  return a;
}

// Worst per-row relative L2 error of `got` against `want`, rows of `dim` values.
double WorstRowError(const std::vector<float>& got, const std::vector<float>& want, size_t dim, size_t* worst_row) {
  double worst = 0.0;
  *worst_row = 0;
  for (size_t r = 0; r * dim < want.size(); ++r) {
    double num = 0.0, den = 0.0;
    for (size_t i = r * dim; i < (r + 1) * dim; ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      num += d * d;
      den += static_cast<double>(want[i]) * want[i];
    }
    const double err = std::sqrt(num / std::max(den, 1e-30));
    if (!std::isfinite(err)) {  // NaN: unwritten or poisoned output
      *worst_row = r;
      return INFINITY;
    }
    if (err > worst) {
      worst = err;
      *worst_row = r;
    }
  }
  return worst;
}

class CudaMlaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<cuda::DeviceInfo> devices;
    const std::string why = cuda::QueryDevices(&devices);
    if (!why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
    major_ = devices[0].compute_major;
  }
  int major_ = 0;
};

// ---------------------------------------------------------------------------------------
// Decode.

struct DecodeShape {
  int R, P, heads, q_per_seq;
  std::vector<int> lens;
  int block_size = 64;
  int64_t q_stride_pad = 0;  // extra elements between query tokens
  int kv_offset = 0;         // MlaDecodeParams::kv_offset: position p at slot p + kv_offset
};

// One launch's inputs and the CPU reference output, reused by several kernel variants.
class DecodeCase {
 public:
  // float_query: the queries are float32 values (the reference's), given to the GPU as bf16
  // value + bf16 remainder (MlaDecodeParams::q_lo) when a run asks for split queries.
  DecodeCase(const DecodeShape& s, unsigned seed, bool float_query = false) : s_(s) {
    std::mt19937 rng(seed);
    const int entry = s.R + s.P;
    const int seqs = static_cast<int>(s.lens.size());
    for (int& len : s_.lens) len = std::max(len, s.q_per_seq);
    max_len_ = *std::max_element(s_.lens.begin(), s_.lens.end());
    const int off = s.kv_offset;  // slots [0, off) of a sequence stay NaN: reading them is an error
    max_blocks_ = (max_len_ + off + s.block_size - 1) / s.block_size + 1;  // one spare column
    // Blocks shuffled over a pool twice as large; unused table entries are -1 and unused
    // cache slots (also past each sequence's end) hold NaN: reading either is an error.
    int used = 0;
    for (int len : s_.lens) used += (len + off + s.block_size - 1) / s.block_size;
    num_blocks_ = 2 * used + 3;
    std::vector<int32_t> ids(num_blocks_);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_tables_.assign(static_cast<size_t>(seqs) * max_blocks_, -1);
    int next = 0;
    for (int q = 0; q < seqs; ++q) {
      for (int b = 0; b < (s_.lens[q] + off + s.block_size - 1) / s.block_size; ++b) {
        block_tables_[static_cast<size_t>(q) * max_blocks_ + b] = ids[next++];
      }
    }
    const size_t slots = static_cast<size_t>(num_blocks_) * s.block_size;
    cache_bits_.assign(slots * entry, 0x7fc0);  // bf16 NaN
    cache_values_.assign(slots * entry, NAN);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int q = 0; q < seqs; ++q) {
      for (int pos = 0; pos < s_.lens[q]; ++pos) {
        const int at = pos + off;
        const int64_t slot =
            static_cast<int64_t>(block_tables_[static_cast<size_t>(q) * max_blocks_ + at / s.block_size]) *
                s.block_size +
            at % s.block_size;
        for (int i = 0; i < entry; ++i) {
          const uint16_t b = F32ToBf16(dist(rng));
          cache_bits_[slot * entry + i] = b;
          cache_values_[slot * entry + i] = Bf16ToF32(b);
        }
      }
    }
    tokens_ = seqs * s.q_per_seq;
    q_stride_ = static_cast<int64_t>(s.heads) * entry + s.q_stride_pad;
    q_ = RandomBf16(static_cast<size_t>(tokens_) * q_stride_, rng, 1.0f);
    if (float_query) {
      std::normal_distribution<float> qd(0.0f, 1.0f);
      q_lo_bits_.resize(q_.bits.size());
      for (size_t i = 0; i < q_.bits.size(); ++i) {
        q_.values[i] = qd(rng);
        q_.bits[i] = F32ToBf16(q_.values[i]);
        q_lo_bits_[i] = F32ToBf16(q_.values[i] - Bf16ToF32(q_.bits[i]));
      }
    }
    // Scores of a few units: softmax neither flat nor one-hot.
    scale_ = 2.0f / std::sqrt(static_cast<float>(entry));
    ComputeReference();
  }

  // Runs the GPU kernel (num_splits / impl: MlaDecodeParams' overrides; optionally
  // captured in a CUDA graph and replayed) and compares with the reference.
  // Returns the worst row error (also with split_q: the queries' remainders passed too).
  double RunAndCheck(int num_splits, int impl, bool use_graph, const std::string& what, bool split_q = false,
                     double tolerance = kTolerance) {
    double err = INFINITY;
    RunAndCheckInto(num_splits, impl, use_graph, what, split_q, tolerance, &err);
    return err;
  }
  void RunAndCheckInto(int num_splits, int impl, bool use_graph, const std::string& what, bool split_q,
                       double tolerance, double* err_out) {
    const int seqs = static_cast<int>(s_.lens.size());
    DeviceBuffer q(q_.bits.size() * 2), q_lo(q_lo_bits_.size() * 2), cache(cache_bits_.size() * 2),
        bt(block_tables_.size() * 4), lens(static_cast<size_t>(seqs) * 4),
        out(static_cast<size_t>(tokens_) * s_.heads * s_.R * 4);
    ASSERT_NE(q.as<void>(), nullptr);
    ASSERT_NE(cache.as<void>(), nullptr);
    ASSERT_TRUE(!split_q || !q_lo_bits_.empty()) << "split queries need a case made with float_query";
    q.Upload(q_.bits);
    if (split_q) q_lo.Upload(q_lo_bits_);
    cache.Upload(cache_bits_);
    bt.Upload(block_tables_);
    lens.Upload(s_.lens);
    ASSERT_EQ(cudaMemset(out.as<void>(), 0xff, out.bytes()), cudaSuccess);  // NaN: catches unwritten outputs
    const size_t ws_bytes =
        num_splits > 0
            ? cuda::MlaDecodeWorkspaceBytesForSplits(seqs, s_.q_per_seq, s_.heads, s_.R, num_splits)
            : cuda::MlaDecodeWorkspaceBytes(seqs, s_.q_per_seq, s_.heads, s_.R, max_len_);
    DeviceBuffer ws(ws_bytes);
    if (ws_bytes > 0) {
      ASSERT_EQ(cudaMemset(ws.as<void>(), 0xff, ws_bytes), cudaSuccess);
    }
    cuda::MlaDecodeParams p;
    p.q = reinterpret_cast<const __nv_bfloat16*>(q.as<uint16_t>());
    p.q_lo = split_q ? reinterpret_cast<const __nv_bfloat16*>(q_lo.as<uint16_t>()) : nullptr;
    p.q_stride = q_stride_;
    p.kv_cache = reinterpret_cast<const __nv_bfloat16*>(cache.as<uint16_t>());
    p.block_tables = bt.as<int32_t>();
    p.cache_lens = lens.as<int32_t>();
    p.kv_offset = s_.kv_offset;
    p.num_seqs = seqs;
    p.q_per_seq = s_.q_per_seq;
    p.num_heads = s_.heads;
    p.kv_lora_rank = s_.R;
    p.rope_dim = s_.P;
    p.block_size = s_.block_size;
    p.max_blocks_per_seq = max_blocks_;
    p.max_cache_len = max_len_;
    p.softmax_scale = scale_;
    p.out = out.as<float>();
    p.out_stride = static_cast<int64_t>(s_.heads) * s_.R;
    p.workspace = ws.as<void>();
    p.workspace_bytes = ws_bytes;
    p.num_splits = num_splits;
    p.impl = impl;
    if (use_graph) {
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      const cudaError_t launch = cuda::MlaDecodeAttention(p, stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(launch, cudaSuccess) << what;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    } else {
      ASSERT_EQ(cuda::MlaDecodeAttention(p, nullptr), cudaSuccess) << what;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    }
    const std::vector<float> got = out.Download<float>(static_cast<size_t>(tokens_) * s_.heads * s_.R);
    size_t row = 0;
    const double err = WorstRowError(got, ref_, s_.R, &row);
    *err_out = err;
    const int token = static_cast<int>(row / s_.heads);
    EXPECT_LE(err, tolerance) << what << ": worst row " << row << " (sequence " << token / s_.q_per_seq
                               << " of length " << s_.lens[token / s_.q_per_seq] << ", query token "
                               << token % s_.q_per_seq << ", head " << row % s_.heads << ")";
  }

 private:
  // MlaAttentionAbsorbed per (sequence, head), with kv_b = [I; I] so that q_latent = q
  // and out = out_latent (nope = v = kv_lora_rank).
  void ComputeReference() {
    const int entry = s_.R + s_.P;
    const int seqs = static_cast<int>(s_.lens.size());
    ref_.assign(static_cast<size_t>(tokens_) * s_.heads * s_.R, 0.0f);
    std::vector<float> eye(static_cast<size_t>(2 * s_.R) * s_.R, 0.0f);
    for (int i = 0; i < s_.R; ++i) {
      eye[static_cast<size_t>(i) * s_.R + i] = 1.0f;
      eye[static_cast<size_t>(s_.R + i) * s_.R + i] = 1.0f;
    }
    const cpu::WeightMatrix kv_b{.dtype = DType::kF32, .rows = 2 * s_.R, .cols = s_.R,
                                 .data = reinterpret_cast<const std::byte*>(eye.data())};
    const int jobs = seqs * s_.heads;
    const int workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        cpu::ThreadPool pool(1);
        for (int job = w; job < jobs; job += workers) {
          const int seq = job / s_.heads, h = job % s_.heads;
          const int tok0 = seq * s_.q_per_seq;
          cpu::MlaAttentionParams p{
              .num_heads = 1, .qk_nope_dim = s_.R, .qk_rope_dim = s_.P, .v_dim = s_.R, .kv_lora_rank = s_.R,
              .softmax_scale = scale_, .q = q_.values.data() + tok0 * q_stride_ + static_cast<int64_t>(h) * entry,
              .q_stride = q_stride_, .num_tokens = s_.q_per_seq, .first_position = s_.lens[seq] - s_.q_per_seq,
              .cache = {.base = cache_values_.data(),
                        .block_table = block_tables_.data() + static_cast<size_t>(seq) * max_blocks_,
                        .block_size = s_.block_size, .entry_dim = entry, .position_offset = s_.kv_offset},
              .kv_b = &kv_b, .out = ref_.data() + (static_cast<size_t>(tok0) * s_.heads + h) * s_.R,
              .out_stride = static_cast<int64_t>(s_.heads) * s_.R};
          cpu::MlaAttentionAbsorbed(p, pool);
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  DecodeShape s_;
  int max_len_ = 0, max_blocks_ = 0, num_blocks_ = 0, tokens_ = 0;
  int64_t q_stride_ = 0;
  float scale_ = 1.0f;
  std::vector<int32_t> block_tables_;
  std::vector<uint16_t> cache_bits_;
  std::vector<float> cache_values_;
  Bf16Array q_;
  std::vector<uint16_t> q_lo_bits_;  // float_query: bf16 remainders of q_.values
  std::vector<float> ref_;
};

std::string Describe(const DecodeShape& s, int splits, int impl) {
  std::string lens;
  for (int l : s.lens) lens += (lens.empty() ? "" : ",") + std::to_string(l);
  return "R=" + std::to_string(s.R) + " P=" + std::to_string(s.P) + " heads=" + std::to_string(s.heads) +
         " q_per_seq=" + std::to_string(s.q_per_seq) + " block=" + std::to_string(s.block_size) + " lens={" + lens +
         "} splits=" + (splits == 0 ? std::string("auto") : std::to_string(splits)) + " impl=" + std::to_string(impl);
}

TEST_F(CudaMlaTest, DecodeMatchesCpuAbsorbed) {
  const bool quick = QuickMode();
  const std::vector<std::pair<int, int>> dims = {{512, 64}, {64, 16}};
  const std::vector<int> heads = quick ? std::vector<int>{4, 16, 128} : std::vector<int>{1, 4, 16, 128};
  const std::vector<int> qps = quick ? std::vector<int>{1, 3} : std::vector<int>{1, 2, 4};
  // Several sequences of different lengths in every launch.
  const std::vector<int> lens = quick ? std::vector<int>{1, 63, 65, 300} : std::vector<int>{1, 63, 64, 65, 1000, 5000};
  unsigned seed = 1;
  for (auto [R, P] : dims) {
    for (int h : heads) {
      for (int q : qps) {
        DecodeShape shape{R, P, h, q, lens};
        shape.q_stride_pad = (h == 4 ? 8 : 0);
        DecodeCase c(shape, seed++);
        // Splits off, forced on (some splits of the short sequences are empty), automatic.
        for (int splits : {1, 5, 0}) {
          c.RunAndCheck(splits, 0, false, Describe(shape, splits, 0));
          // The portable kernel where the automatic choice is the sm_90a one.
          if (major_ == 9 && R == 512 && P == 64) {
            c.RunAndCheck(splits, 1, false, Describe(shape, splits, 1));
          }
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The MTP layer's cache (docs/speculative-decoding.md): position p at slot p + 1, the slot
// before a sequence's first position NaN, so reading it poisons the output.
TEST_F(CudaMlaTest, DecodeWithAKvOffsetReadsTheShiftedSlots) {
  for (const auto& [R, P] : std::vector<std::pair<int, int>>{{512, 64}, {64, 16}}) {
    for (int q_per_seq : {1, 3}) {
      DecodeShape s{.R = R, .P = P, .heads = 16, .q_per_seq = q_per_seq, .lens = {3, 63, 64, 65, 300},
                    .kv_offset = 1};
      DecodeCase c(s, 77u + q_per_seq);
      for (int impl : {0, 1, 2}) {
        if (impl == 2 && !(major_ == 9 && R == 512 && P == 64)) continue;
        for (int splits : {0, 1}) c.RunAndCheck(splits, impl, false, "kv_offset 1, " + Describe(s, splits, impl));
      }
    }
  }
}

TEST_F(CudaMlaTest, DecodeSplitQueriesAreNearFloat32) {
  // Float32 queries (the reference's): as bf16 only, rows are within the bf16 tolerance;
  // with their remainders (q_lo) where a sequence's rows fit half a tile (wgmma: <= 32,
  // portable: <= 8), the scores and probabilities are near-float32 and the rows within
  // 2e-4; elsewhere q_lo is ignored (the same result).
  const std::vector<int> lens = QuickMode() ? std::vector<int>{1, 65, 300} : std::vector<int>{1, 63, 65, 1000, 5000};
  unsigned seed = 100;
  for (auto [R, P] : std::vector<std::pair<int, int>>{{512, 64}, {64, 16}}) {
    for (int h : {1, 4, 16, 32, 128}) {
      for (int q : {1, 2}) {
        DecodeShape shape{R, P, h, q, lens};
        DecodeCase c(shape, seed++, /*float_query=*/true);
        const bool wgmma = major_ == 9 && R == 512 && P == 64;
        for (int impl : {0, 1}) {
          if (impl == 1 && !wgmma) continue;  // the automatic choice is the portable kernel already
          const bool split_applies = impl == 0 && wgmma ? false : true;  // EXPERIMENT: wgmma kernel as on main
          for (int splits : {1, 5, 0}) {
            const std::string what = Describe(shape, splits, impl);
            const double plain = c.RunAndCheck(splits, impl, false, what + " bf16 queries");
            const double split = c.RunAndCheck(splits, impl, splits == 0, what + " split queries", true,
                                               split_applies ? 2e-4 : kTolerance);
            if (split_applies) {
              EXPECT_LT(split, plain / 8) << what;
            } else {
              EXPECT_EQ(split, plain) << what << ": q_lo is ignored here";
            }
            std::printf("%s: worst row error %.2e with bf16 queries, %.2e with split queries\n", what.c_str(), plain,
                        split);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST_F(CudaMlaTest, DecodeOtherBlockSizesAndDims) {
  // Cache blocks other than 64 positions, and the smallest and odd widths the header allows.
  struct Case {
    int R, P, heads, qps, block;
  };
  for (const Case& k : std::vector<Case>{{64, 16, 4, 2, 16}, {512, 64, 16, 1, 128}, {32, 0, 3, 1, 64},
                                         {96, 48, 5, 3, 32}, {256, 32, 20, 1, 64}, {512, 64, 128, 1, 32}}) {
    DecodeShape shape{k.R, k.P, k.heads, k.qps, QuickMode() ? std::vector<int>{5, 130} : std::vector<int>{5, 130, 777}};
    shape.block_size = k.block;
    DecodeCase c(shape, 1000 + k.R + k.heads);
    for (int splits : {1, 3}) c.RunAndCheck(splits, 0, false, Describe(shape, splits, 0));
  }
}

TEST_F(CudaMlaTest, DecodeCapturesInCudaGraph) {
  DecodeShape shape{512, 64, 16, 1, {100, 2000}};
  DecodeCase c(shape, 77);
  c.RunAndCheck(0, 0, true, "graph " + Describe(shape, 0, 0));
  DecodeShape wide{512, 64, 128, 1, {100, 2000}};
  DecodeCase w(wide, 78);
  w.RunAndCheck(4, 0, true, "graph " + Describe(wide, 4, 0));
}

TEST_F(CudaMlaTest, DecodeRejectsBadParams) {
  cuda::MlaDecodeParams p;
  p.num_seqs = 1;
  EXPECT_EQ(cuda::MlaDecodeAttention(p, nullptr), cudaErrorInvalidValue);
  p.num_seqs = 0;
  EXPECT_EQ(cuda::MlaDecodeAttention(p, nullptr), cudaSuccess);  // nothing to do
}

// ---------------------------------------------------------------------------------------
// Prefill.

struct PrefillShape {
  int heads, nope, rope, v, num_q, num_kv;
};

// impls: MlaPrefillParams::impl values to run (0 = automatic).
void CheckPrefill(const PrefillShape& s, unsigned seed, const std::vector<int>& impls) {
  const std::string what = "heads=" + std::to_string(s.heads) + " nope=" + std::to_string(s.nope) +
                           " rope=" + std::to_string(s.rope) + " v=" + std::to_string(s.v) +
                           " num_q=" + std::to_string(s.num_q) + " num_kv=" + std::to_string(s.num_kv);
  std::mt19937 rng(seed);
  const int lora = 64;
  const int entry = lora + s.rope;
  // A contiguous latent cache (block table = identity) and kv_b, both bf16-exact.
  const int block = 64;
  const int blocks = (s.num_kv + block - 1) / block;
  Bf16Array cache = RandomBf16(static_cast<size_t>(blocks) * block * entry, rng, 1.0f);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  Bf16Array kv_b = RandomBf16(static_cast<size_t>(s.heads) * (s.nope + s.v) * lora, rng, 1.0f / std::sqrt(64.0f));
  const int qk = s.nope + s.rope;
  Bf16Array q = RandomBf16(static_cast<size_t>(s.num_q) * s.heads * qk, rng, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));

  // GPU inputs as the model makes them: kv = latent · kv_b^T -> [key][head][nope | v]
  // (bf16), the rope part straight from the cache entries.
  const cpu::WeightMatrix w{.dtype = DType::kF32, .rows = static_cast<int64_t>(s.heads) * (s.nope + s.v), .cols = lora,
                            .data = reinterpret_cast<const std::byte*>(kv_b.values.data())};
  cpu::ThreadPool pool(0);
  std::vector<float> kv(static_cast<size_t>(s.num_kv) * s.heads * (s.nope + s.v));
  cpu::Matmul({.x = cache.values.data(), .m = s.num_kv, .x_stride = entry, .w = &w, .y = kv.data(),
               .y_stride = static_cast<int64_t>(s.heads) * (s.nope + s.v)},
              pool);
  std::vector<uint16_t> kv_bits(kv.size());
  for (size_t i = 0; i < kv.size(); ++i) kv_bits[i] = F32ToBf16(kv[i]);

  std::vector<float> ref(static_cast<size_t>(s.num_q) * s.heads * s.v);
  cpu::MlaAttentionExpanded(
      {.num_heads = s.heads, .qk_nope_dim = s.nope, .qk_rope_dim = s.rope, .v_dim = s.v, .kv_lora_rank = lora,
       .softmax_scale = scale, .q = q.values.data(), .q_stride = static_cast<int64_t>(s.heads) * qk,
       .num_tokens = s.num_q, .first_position = s.num_kv - s.num_q,
       .cache = {.base = cache.values.data(), .block_table = table.data(), .block_size = block, .entry_dim = entry},
       .kv_b = &w, .out = ref.data(), .out_stride = static_cast<int64_t>(s.heads) * s.v},
      pool);

  // Two layouts of the same keys and values: kv_b's output as it is ([key][head][nope | v],
  // through the head strides), and dense [key][head][nope] / [key][head][v] arrays.
  std::vector<uint16_t> nope_bits, v_bits;
  for (int k = 0; k < s.num_kv; ++k) {
    for (int h = 0; h < s.heads; ++h) {
      const uint16_t* src = &kv_bits[(static_cast<size_t>(k) * s.heads + h) * (s.nope + s.v)];
      nope_bits.insert(nope_bits.end(), src, src + s.nope);
      v_bits.insert(v_bits.end(), src + s.nope, src + s.nope + s.v);
    }
  }
  DeviceBuffer dq(q.bits.size() * 2), dkv(kv_bits.size() * 2), dnope(nope_bits.size() * 2), dv(v_bits.size() * 2),
      dcache(cache.bits.size() * 2), dout(ref.size() * 4);
  dq.Upload(q.bits);
  dkv.Upload(kv_bits);
  dnope.Upload(nope_bits);
  dv.Upload(v_bits);
  dcache.Upload(cache.bits);
  for (int variant = 0; variant < 2 * static_cast<int>(impls.size()); ++variant) {
    const bool interleaved = variant % 2 == 0;
    const int impl = impls[variant / 2];
    ASSERT_EQ(cudaMemset(dout.as<void>(), 0xff, dout.bytes()), cudaSuccess);
    const auto* kvp = reinterpret_cast<const __nv_bfloat16*>(dkv.as<uint16_t>());
    cuda::MlaPrefillParams p;
    p.q = reinterpret_cast<const __nv_bfloat16*>(dq.as<uint16_t>());
    if (interleaved) {
      p.k_nope = kvp;
      p.v = kvp + s.nope;
      p.k_nope_stride = p.v_stride = static_cast<int64_t>(s.heads) * (s.nope + s.v);
      p.k_nope_head_stride = p.v_head_stride = s.nope + s.v;
    } else {
      p.k_nope = reinterpret_cast<const __nv_bfloat16*>(dnope.as<uint16_t>());
      p.v = reinterpret_cast<const __nv_bfloat16*>(dv.as<uint16_t>());
      p.k_nope_stride = static_cast<int64_t>(s.heads) * s.nope;
      p.v_stride = static_cast<int64_t>(s.heads) * s.v;
    }
    p.k_rope = reinterpret_cast<const __nv_bfloat16*>(dcache.as<uint16_t>()) + lora;
    p.q_stride = static_cast<int64_t>(s.heads) * qk;
    p.k_rope_stride = entry;
    p.num_q = s.num_q;
    p.num_kv = s.num_kv;
    p.num_heads = s.heads;
    p.nope_dim = s.nope;
    p.rope_dim = s.rope;
    p.v_dim = s.v;
    p.softmax_scale = scale;
    p.out = dout.as<float>();
    p.out_stride = static_cast<int64_t>(s.heads) * s.v;
    p.impl = impl;
    const std::string layout = std::string(interleaved ? " (kv_b layout" : " (dense") + ", impl " + std::to_string(impl) + ")";
    ASSERT_EQ(cuda::MlaPrefillAttention(p, nullptr), cudaSuccess) << what << layout;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what << layout;
    const std::vector<float> got = dout.Download<float>(ref.size());
    size_t row = 0;
    const double err = WorstRowError(got, ref, s.v, &row);
    // kv rounded to bf16 for the GPU (the reference keeps it in fp32): same tolerance.
    EXPECT_LE(err, kTolerance) << what << layout << ": worst row " << row << " (query " << row / s.heads
                               << ", head " << row % s.heads << ")";
  }
}

TEST_F(CudaMlaTest, PrefillMatchesCpuExpanded) {
  const bool quick = QuickMode();
  // tiny model dims, DeepSeek-V2/V3 dims, the widest allowed, and odd widths.
  const std::vector<std::array<int, 4>> dims = {{4, 32, 16, 32}, {3, 128, 64, 128}, {2, 192, 64, 192}, {2, 48, 32, 80}};
  std::vector<std::pair<int, int>> lengths = {{1, 1}, {17, 17}, {64, 64}, {100, 100}, {130, 300},
                                              {1, 500}, {77, 1077}, {300, 300}};
  if (quick) lengths = {{1, 1}, {65, 65}, {70, 200}, {150, 150}};
  unsigned seed = 100;
  for (const auto& d : dims) {
    // Where the automatic choice is the sm_90a kernel, the portable one too.
    const bool deepseek = d[1] == 128 && d[2] == 64 && d[3] == 128;
    const std::vector<int> impls = major_ == 9 && deepseek ? std::vector<int>{0, 1} : std::vector<int>{0};
    for (auto [nq, nkv] : lengths) {
      CheckPrefill({d[0], d[1], d[2], d[3], nq, nkv}, seed++, impls);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaMlaTest, PrefillRejectsBadParams) {
  cuda::MlaPrefillParams p;
  p.num_q = 4;
  p.num_kv = 2;  // fewer keys than queries
  EXPECT_EQ(cuda::MlaPrefillAttention(p, nullptr), cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------
// KV cache write.

TEST_F(CudaMlaTest, KvCacheWriteScattersBf16) {
  for (int entry_dim : {80, 576, 33}) {
    std::mt19937 rng(entry_dim);
    const int tokens = 70, num_slots = 256;
    const int64_t stride = entry_dim + (entry_dim % 2 == 0 ? 4 : 1);
    std::vector<float> entries(static_cast<size_t>(tokens) * stride);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (float& v : entries) v = dist(rng);
    std::vector<int32_t> perm(num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> slots(perm.begin(), perm.begin() + tokens);
    slots[5] = -1;  // skipped
    std::vector<uint16_t> expected(static_cast<size_t>(num_slots) * entry_dim, 0x1234);
    for (int i = 0; i < tokens; ++i) {
      if (slots[i] < 0) continue;
      for (int j = 0; j < entry_dim; ++j) {
        expected[static_cast<size_t>(slots[i]) * entry_dim + j] = F32ToBf16(entries[static_cast<size_t>(i) * stride + j]);
      }
    }
    DeviceBuffer de(entries.size() * 4), ds(slots.size() * 4), dc(expected.size() * 2);
    de.Upload(entries);
    ds.Upload(slots);
    dc.Upload(std::vector<uint16_t>(expected.size(), 0x1234));
    ASSERT_EQ(cuda::KvCacheWrite({.entries = de.as<float>(), .entries_stride = stride, .slots = ds.as<int32_t>(),
                                  .num_tokens = tokens, .entry_dim = entry_dim,
                                  .kv_cache = reinterpret_cast<__nv_bfloat16*>(dc.as<uint16_t>()),
                                  .num_slots = num_slots},
                                 nullptr),
              cudaSuccess);
    EXPECT_EQ(dc.Download<uint16_t>(expected.size()), expected) << "entry_dim " << entry_dim;
  }
}

}  // namespace
}  // namespace tandem
