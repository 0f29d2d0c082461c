// DeepSeek-V4 decode on the GPU (engine/model/deepseek_v4/cuda) at a config's real widths,
// against the memory roofline measured in the same run (bench/cuda_copy_rate.h).
//
//   v4_cuda_decode_bench [--config FILE] [--layers N|fit] [--experts E] [--contexts 1024,32768,...]
//                        [--steps S] [--prefill N [--prefill-chunk C]] [--json FILE]
//
// The weights are synthetic, built in host memory in DeepSeek's FP8 checkpoint formats (FP8
// linears with 128x128 block scales, FP4 routed experts with power-of-two scales, bf16
// compressors, indexer weights, router, embedding and head, float32 mHC) and uploaded as a
// checkpoint would be; matrices of one format share their random codes (the timing does not
// depend on the values; without a checkpoint, a 100 GB model is built in seconds). --experts
// stores fewer routed experts than the config names (a step reads num_experts_per_tok of
// them whatever their number). Each context n is decoded from a pool zeroed as if n tokens
// had been prefilled (attention reads n tokens' entries of zeros): one sequence, batch 1.
//
// Bytes a step reads: bench/v4_decode_bytes.h, in two forms: `checkpoint_bytes` (the
// weights as the FP8 checkpoint stores them, FP4 at half a byte plus a ue8m0 byte per 32:
// the goal's roofline) and `engine_bytes` (what this engine's GPU form reads: bf16
// matrices widened to float32, FP4 scales as floats).
// The KV entries are float32 in both.
//
// --prefill N first times one sequence's N-token prompt from position 0 (in chunks of C),
// with the FP8 matrices on the FP8 tensor cores (CudaV4Model::Options::fp8_gemm) and widened
// to float32, the same model alternately; its rate is the linears' FLOPs (2 x the weight
// elements a token multiplies: every dense matrix, num_experts_per_tok routed experts; not
// the attention's own products) per second over cuBLASLt's block-scaled FP8 GEMM rate at
// m = min(N, 8192), 4096 x 4096, measured in the same run.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cublaslt_fp8.h"
#include "bench/cuda_copy_rate.h"
#include "bench/read_bandwidth.h"
#include "bench/v4_decode_bytes.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"
#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "kernels/common/dtype.h"
#include "nlohmann/json.hpp"

namespace tandem::v4 {
namespace {

using Clock = std::chrono::steady_clock;

// Random weights at the config's shapes, viewing shared code buffers.
class SyntheticWeights {
 public:
  SyntheticWeights(const DeepseekV4Config& c, int64_t experts) : c_(c) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t d = c.hidden_size, hd = c.num_attention_heads * c.head_dim;
    const int64_t largest_fp8 = std::max({hd * c.q_lora_rank, d * c.o_groups * c.o_lora_rank,
                                          c.o_groups * c.o_lora_rank * c.o_group_in(), 2 * c.moe_intermediate_size * d,
                                          c.index_n_heads * c.index_head_dim * c.q_lora_rank});
    fp8_.resize(static_cast<size_t>(largest_fp8));
    for (uint8_t& b : fp8_) b = F32ToF8E4M3(16.0f * normal(rng));  // |values| well inside e4m3's 448
    fp4_.resize(static_cast<size_t>(c.moe_intermediate_size * d / 2));
    for (uint8_t& b : fp4_) b = static_cast<uint8_t>(rng());
    bf16_.resize(static_cast<size_t>(c.vocab_size * d));
    for (uint16_t& v : bf16_) v = F32ToBf16(0.02f * normal(rng));
    f32_.resize(static_cast<size_t>((2 + c.hc_mult) * c.hc_mult * c.hc_mult * d));
    for (float& v : f32_) v = 0.02f * normal(rng);

    w_.embed = Bf16(c.vocab_size, d);
    w_.head = Bf16(c.vocab_size, d);
    w_.norm = Vector(d, 1.0f);
    const int64_t n = c.hc_mult, mix = (2 + n) * n;
    w_.hc_head = {.fn = F32(n, n * d), .base = Vector(n, 0.5f), .scale = Vector(1, 1.0f)};
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      LayerWeights lw;
      lw.attn_norm = Vector(d, 1.0f);
      lw.ffn_norm = Vector(d, 1.0f);
      lw.attn_hc = {.fn = F32(mix, n * d), .base = Vector(mix, 0.5f), .scale = Vector(3, 1.0f)};
      lw.ffn_hc = {.fn = F32(mix, n * d), .base = Vector(mix, 0.5f), .scale = Vector(3, 1.0f)};
      AttentionWeights& a = lw.attention;
      a.q_a_proj = Fp8(c.q_lora_rank, d);
      a.q_a_norm = Vector(c.q_lora_rank, 1.0f);
      a.q_b_proj = Fp8(hd, c.q_lora_rank);
      a.kv_proj = Fp8(c.head_dim, d);
      a.kv_norm = Vector(c.head_dim, 1.0f);
      for (int64_t g = 0; g < c.o_groups; ++g) a.o_a_groups.push_back(Fp8(c.o_lora_rank, c.o_group_in()));
      a.o_b_proj = Fp8(d, c.o_groups * c.o_lora_rank);
      a.sinks = Vector(c.num_attention_heads, 0.0f);
      const AttentionType type = c.layer_types[static_cast<size_t>(l)];
      if (type == AttentionType::kCompressedSparse) {
        a.compressor = Compressor(c.head_dim, 2 * c.head_dim, c.compress_rate_csa);
        a.indexer = IndexerWeights{.compressor = Compressor(c.index_head_dim, 2 * c.index_head_dim, c.compress_rate_csa),
                                   .q_b_proj = Fp8(c.index_n_heads * c.index_head_dim, c.q_lora_rank),
                                   .weights_proj = Bf16(c.index_n_heads, d)};
      } else if (type == AttentionType::kHeavilyCompressed) {
        a.compressor = Compressor(c.head_dim, c.head_dim, c.compress_rate_hca);
      }
      MoeWeights& m = lw.moe;
      m.router = Bf16(c.n_routed_experts, d);
      m.correction_bias = Vector(c.n_routed_experts, 0.0f);
      if (c.mlp_layer_types[static_cast<size_t>(l)] == MlpType::kHashMoe) {
        std::vector<int32_t>& ids = OwnI32(c.vocab_size * c.num_experts_per_tok);
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + i / 6) % c.n_routed_experts);
        m.tid2eid = ids.data();
      }
      const int64_t inter = c.moe_intermediate_size;
      for (int64_t e = 0; e < experts; ++e) m.experts.push_back({Fp4(inter, d), Fp4(inter, d), Fp4(d, inter)});
      m.shared = {Fp8(inter, d), Fp8(inter, d), Fp8(d, inter)};
      w_.layers.push_back(std::move(lw));
    }
  }
  const ModelWeights& weights() const { return w_; }

 private:
  const float* Vector(int64_t n, float value) {
    owned_f32_.push_back(std::make_unique<std::vector<float>>(static_cast<size_t>(n), value));
    return owned_f32_.back()->data();
  }
  std::vector<int32_t>& OwnI32(int64_t n) {
    owned_i32_.push_back(std::make_unique<std::vector<int32_t>>(static_cast<size_t>(n)));
    return *owned_i32_.back();
  }
  WeightMatrix Fp8(int64_t rows, int64_t cols) {
    // codes ~ N(0, 16^2): the scale makes the weights ~ N(0, 1 / cols).
    const float* scales = Vector(((rows + 127) / 128) * ((cols + 127) / 128), 1.0f / (16.0f * std::sqrt(cols)));
    return {.dtype = DType::kF8E4M3, .rows = rows, .cols = cols,
            .data = reinterpret_cast<const std::byte*>(fp8_.data()), .block_scales = scales};
  }
  WeightMatrix Fp4(int64_t rows, int64_t cols) {
    // Uniform codes have a standard deviation of about 2.9: a power-of-two scale near
    // 1 / (2.9 sqrt(cols)). The bf16 view (the CPU's widening) is never read here.
    const float scale = std::ldexp(1.0f, -static_cast<int>(std::lround(std::log2(2.9 * std::sqrt(cols)))));
    return {.dtype = DType::kBF16, .rows = rows, .cols = cols,
            .data = reinterpret_cast<const std::byte*>(bf16_.data()), .fp4_codes = fp4_.data(),
            .fp4_scales = Vector(rows * (cols / 32), scale)};
  }
  WeightMatrix Bf16(int64_t rows, int64_t cols) {
    return {.dtype = DType::kBF16, .rows = rows, .cols = cols, .data = reinterpret_cast<const std::byte*>(bf16_.data())};
  }
  WeightMatrix F32(int64_t rows, int64_t cols) {
    return {.dtype = DType::kF32, .rows = rows, .cols = cols, .data = reinterpret_cast<const std::byte*>(f32_.data())};
  }
  CompressorWeights Compressor(int64_t width, int64_t proj, int64_t rate) {
    return {.kv_proj = Bf16(proj, c_.hidden_size), .gate_proj = Bf16(proj, c_.hidden_size),
            .position_bias = Vector(rate * proj, 0.0f), .norm = Vector(width, 1.0f)};
  }

  DeepseekV4Config c_;
  std::vector<uint8_t> fp8_, fp4_;
  std::vector<uint16_t> bf16_;
  std::vector<float> f32_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_f32_;
  std::vector<std::unique_ptr<std::vector<int32_t>>> owned_i32_;
  ModelWeights w_;
};

// A matrix as this engine's GPU form holds and reads it: bf16 and FP8 as stored, FP4
// scales as floats, float32 as float32.
uint64_t EngineMatrixBytes(const WeightMatrix& x) {
  const uint64_t n = static_cast<uint64_t>(x.rows) * x.cols;
  if (x.fp4_codes != nullptr) return n / 2 + n / 32 * 4;
  if (x.dtype == DType::kF8E4M3) return bench::MatrixBytes(x);
  return x.dtype == DType::kBF16 && x.cols % 8 == 0 ? n * 2 : n * 4;
}

// Layer `l`'s matrices but its routed experts: every step reads all of them.
uint64_t DenseLayerBytes(const LayerWeights& l) {
  const auto m = EngineMatrixBytes;
  const AttentionWeights& a = l.attention;
  uint64_t bytes = m(a.q_a_proj) + m(a.q_b_proj) + m(a.kv_proj) + m(a.o_b_proj);
  for (const WeightMatrix& g : a.o_a_groups) bytes += m(g);
  if (a.compressor) bytes += m(a.compressor->kv_proj) + m(a.compressor->gate_proj);
  if (a.indexer) {
    bytes += m(a.indexer->compressor.kv_proj) + m(a.indexer->compressor.gate_proj) + m(a.indexer->q_b_proj) +
             m(a.indexer->weights_proj);
  }
  bytes += m(l.attn_hc.fn) + m(l.ffn_hc.fn) + m(l.moe.router);
  return bytes + m(l.moe.shared.gate) + m(l.moe.shared.up) + m(l.moe.shared.down);
}

uint64_t ExpertBytes(const ExpertWeights& e) {
  return EngineMatrixBytes(e.gate) + EngineMatrixBytes(e.up) + EngineMatrixBytes(e.down);
}

// What this engine's GPU form reads for a step: the routed experts a token touches.
uint64_t EngineBytes(const DeepseekV4Config& c, const ModelWeights& w) {
  uint64_t bytes = static_cast<uint64_t>(c.hidden_size) * 4;
  for (const LayerWeights& l : w.layers) {
    bytes += DenseLayerBytes(l) + c.num_experts_per_tok * ExpertBytes(l.moe.experts[0]);
  }
  return bytes + EngineMatrixBytes(w.hc_head.fn) + EngineMatrixBytes(w.head);
}

uint64_t Elements(const WeightMatrix& x) { return static_cast<uint64_t>(x.rows) * x.cols; }

// The weight elements one token multiplies in the decoder layers (the --prefill rate).
uint64_t LinearElementsPerToken(const DeepseekV4Config& c, const ModelWeights& w) {
  uint64_t n = 0;
  for (const LayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attention;
    n += Elements(a.q_a_proj) + Elements(a.q_b_proj) + Elements(a.kv_proj) + Elements(a.o_b_proj);
    for (const WeightMatrix& g : a.o_a_groups) n += Elements(g);
    if (a.compressor) n += Elements(a.compressor->kv_proj) + Elements(a.compressor->gate_proj);
    if (a.indexer) {
      n += Elements(a.indexer->compressor.kv_proj) + Elements(a.indexer->compressor.gate_proj) +
           Elements(a.indexer->q_b_proj) + Elements(a.indexer->weights_proj);
    }
    n += Elements(l.attn_hc.fn) + Elements(l.ffn_hc.fn) + Elements(l.moe.router);
    n += Elements(l.moe.shared.gate) + Elements(l.moe.shared.up) + Elements(l.moe.shared.down);
    const ExpertWeights& e = l.moe.experts[0];
    n += c.num_experts_per_tok * (Elements(e.gate) + Elements(e.up) + Elements(e.down));
  }
  return n;
}

// cuBLASLt's block-scaled FP8 GEMM rate (FLOP/s) at m x 4096 x 4096, bf16 out: the median
// of 5 timed batches of 10.
double CublasLtFp8Rate(int m) {
  constexpr int n = 4096, k = 4096;
  uint8_t *x, *w;
  float *xs, *ws;
  __nv_bfloat16* y;
  void* workspace;
  const size_t workspace_bytes = size_t{64} << 20;
  CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(m) * k));
  CHECK_CUDA(cudaMalloc(&w, static_cast<size_t>(n) * k));
  CHECK_CUDA(cudaMalloc(&xs, static_cast<size_t>(m) * (k / 128) * 4));
  CHECK_CUDA(cudaMalloc(&ws, static_cast<size_t>(n / 128) * (k / 128) * 4));
  CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(m) * n * 2));
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  // Codes spread like quantized data (|value| in [2^-3, 2^5), no NaNs), not a constant:
  // the tensor cores' clock and power depend on how the operands' bits toggle.
  std::vector<uint8_t> codes(static_cast<size_t>(std::max(m, n) + 1) * k);
  uint32_t state = 12345;
  for (uint8_t& c : codes) {
    state = state * 1664525u + 1013904223u;
    c = static_cast<uint8_t>(((state >> 24) & 0x80) | (0x20 + (state >> 8) % 0x40));
  }
  CHECK_CUDA(cudaMemcpy(x, codes.data(), static_cast<size_t>(m) * k, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(w, codes.data() + k, static_cast<size_t>(n) * k, cudaMemcpyHostToDevice));
  const std::vector<float> ones(static_cast<size_t>(m) * (k / 128), 1.0f / 64);
  CHECK_CUDA(cudaMemcpy(xs, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(ws, ones.data(), static_cast<size_t>(n / 128) * (k / 128) * 4, cudaMemcpyHostToDevice));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  double rate = 0.0;
  {
    bench::LtFp8 gemm(lt, bench::LtFp8::Scaling::kBlock, false, m, n, k, x, xs, w, ws, y, workspace, workspace_bytes);
    std::unique_ptr<bench::LtFp8> other;
    bench::LtFp8* run = &gemm;
    if (!gemm.ok()) {
      other = std::make_unique<bench::LtFp8>(lt, bench::LtFp8::Scaling::kBlock, true, m, n, k, x, xs, w, ws, y,
                                             workspace, workspace_bytes);
      run = other->ok() ? other.get() : nullptr;
    }
    if (run != nullptr) {
      cudaEvent_t a, b;
      CHECK_CUDA(cudaEventCreate(&a));
      CHECK_CUDA(cudaEventCreate(&b));
      std::vector<double> ms;
      for (int r = 0; r < 6; ++r) {
        CHECK_CUDA(cudaEventRecord(a));
        for (int i = 0; i < 10; ++i) run->Run();
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float t = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
        if (r > 0) ms.push_back(t / 10.0);
      }
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      rate = 2.0 * m * n * k / (bench::Percentile(ms, 0.5) * 1e-3);
    }
  }
  cublasLtDestroy(lt);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(xs), static_cast<void*>(ws),
                  static_cast<void*>(y), workspace}) {
    cudaFree(p);
  }
  return rate;
}

// What layer `l` takes on the GPU, every stored expert included.
uint64_t StoredLayerBytes(const LayerWeights& l) {
  uint64_t bytes = DenseLayerBytes(l);
  for (const ExpertWeights& e : l.moe.experts) bytes += ExpertBytes(e);
  return bytes;
}

// The decoder layers of `c` that fit the GPU's free memory with `experts` stored a layer,
// after the embedding and head, a KV pool for `tokens` positions and a margin for the
// activations, cuBLAS and the captured graphs (the acceptance's "as many layers as fit one
// GPU with a useful KV cache"). At least 1, at most the config's.
int64_t LayersThatFit(const DeepseekV4Config& c, int64_t experts, int64_t tokens) {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 1;
  constexpr double kMargin = 6.0 * (1 << 30);
  const double fixed = 2.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size) * 2.0 + kMargin;
  SyntheticWeights all(c, experts);
  int64_t fit = 0;
  double used = fixed;
  for (const LayerWeights& l : all.weights().layers) {
    DeepseekV4Config cut = c;
    cut.num_hidden_layers = fit + 1;
    const int64_t blocks = (tokens + 63) / 64;
    absl::StatusOr<size_t> kv = KvPool::BytesFor(KvStreamsFor(cut), {.num_layers = static_cast<int32_t>(fit + 1),
                                                                      .block_size = 64, .num_blocks = blocks,
                                                                      .num_sequence_slots = 1});
    const double next = used + static_cast<double>(StoredLayerBytes(l));
    if (!kv.ok() || next + static_cast<double>(*kv) > static_cast<double>(free_bytes)) break;
    used = next;
    ++fit;
  }
  return std::max<int64_t>(fit, 1);
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--config FILE] [--layers N|fit] [--experts E] [--contexts N,N,...] [--steps S] [--eager-too] [--shared-expert-serial] [--prefill N [--prefill-chunk C]] [--profile] [--json FILE]\n"
               "  DeepSeek-V4 GPU decode at batch 1 against a same-run copy (bench/README.md)\n"
               "  --config    a deepseek_v4 config.json (default bench/configs/v4_flash_widths.json)\n"
               "  --layers    decoder layers to build (default: the config's); `fit`: as many of V4-Flash's 43 as\n"
               "              the GPU's free memory holds beside the head and a KV pool for the longest context\n"
               "  --experts   routed experts to store per layer (default: the config's)\n"
               "  --contexts  context lengths to decode at (default 1024,32768,131072)\n"
               "  --steps     timed decode steps per context (default 24)\n"
               "  --eager-too also time each context without CUDA graphs (the same model, same run)\n"
               "  --shared-expert-serial  the shared expert after the routed experts on the one stream\n"
               "  --prefill   first time an N-token prompt's prefill, FP8 GEMMs against float32 (default 0: none)\n"
               "  --prefill-chunk  tokens a pass during that prefill (default: all N in one)\n"
               "              (default: beside them on a second stream where its products are GEMVs)\n"
               "  --profile   bracket the first context's last step with cudaProfilerStart/Stop (for nsys\n"
               "              --capture-range=cudaProfilerApi or ncu --profile-from-start off)\n"
               "  --json      also write the JSON here\n",
               argv0);
  return 2;
}

int Main(int argc, char** argv) {
  std::string config_path = "bench/configs/v4_flash_widths.json", json_path;
  int64_t layers = 0, experts = 0;
  bool fit_layers = false;
  int steps = 24;
  bool profile = false, eager_too = false, shared_serial = false;
  int64_t prefill = 0, prefill_chunk = 0;
  std::vector<int64_t> contexts = {1024, 32768, 131072};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--config") config_path = next();
    else if (a == "--layers") {
      const std::string v = next();
      if (v == "fit") fit_layers = true;
      else if (!absl::SimpleAtoi(v, &layers) || layers < 1) return Usage(argv[0]);
    }
    else if (a == "--experts") experts = std::stoll(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--json") json_path = next();
    else if (a == "--profile") profile = true;
    else if (a == "--eager-too") eager_too = true;
    else if (a == "--shared-expert-serial") shared_serial = true;
    else if (a == "--prefill") {
      if (!absl::SimpleAtoi(next(), &prefill) || prefill < 0) return Usage(argv[0]);
    } else if (a == "--prefill-chunk") {
      if (!absl::SimpleAtoi(next(), &prefill_chunk) || prefill_chunk < 1) return Usage(argv[0]);
    }
    else if (a == "--contexts") {
      contexts.clear();
      for (absl::string_view s : absl::StrSplit(next(), ',')) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(s, &v) || v < 1) return Usage(argv[0]);
        contexts.push_back(v);
      }
    } else return Usage(argv[0]);
  }
  if (steps < 1 || contexts.empty()) return Usage(argv[0]);
  std::ifstream in(config_path);
  if (!in) {
    std::fprintf(stderr, "v4_cuda_decode_bench: cannot read %s\n", config_path.c_str());
    return 2;
  }
  nlohmann::json cj = nlohmann::json::parse(in, nullptr, false);
  if (cj.is_discarded()) {
    std::fprintf(stderr, "v4_cuda_decode_bench: %s is not JSON\n", config_path.c_str());
    return 2;
  }
  // The config with n decoder layers, its per-layer type lists repeated to that length.
  const auto with_layers = [](nlohmann::json j, int64_t n) {
    j["num_hidden_layers"] = n;
    for (const char* key : {"layer_types", "mlp_layer_types"}) {
      if (j.contains(key) && j[key].is_array() && !j[key].empty()) {
        nlohmann::json cut = nlohmann::json::array();
        for (int64_t l = 0; l < n; ++l) cut.push_back(j[key][static_cast<size_t>(l % j[key].size())]);
        j[key] = cut;
      }
    }
    return j;
  };
  if (fit_layers) {
    // Up to V4-Flash's 43 decoder layers (the widths config keeps 8 for the default runs).
    constexpr int64_t kV4FlashLayers = 43;
    absl::StatusOr<DeepseekV4Config> full = ParseDeepseekV4Config(with_layers(cj, kV4FlashLayers).dump());
    if (!full.ok()) {
      std::fprintf(stderr, "v4_cuda_decode_bench: %s\n", std::string(full.status().message()).c_str());
      return 2;
    }
    const int64_t stored = experts <= 0 || experts > full->n_routed_experts ? full->n_routed_experts : experts;
    layers = LayersThatFit(*full, stored, *std::max_element(contexts.begin(), contexts.end()) + steps + 8);
    std::fprintf(stderr, "--layers fit: %lld of V4-Flash's %lld layers fit the GPU\n", static_cast<long long>(layers),
                 static_cast<long long>(kV4FlashLayers));
  }
  if (layers > 0) cj = with_layers(cj, layers);
  absl::StatusOr<DeepseekV4Config> parsed = ParseDeepseekV4Config(cj.dump());
  if (!parsed.ok()) {
    std::fprintf(stderr, "v4_cuda_decode_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const DeepseekV4Config& c = *parsed;
  if (experts <= 0 || experts > c.n_routed_experts) experts = c.n_routed_experts;
  const double copy_gbs = bench::DeviceCopyBytesPerSecond() / 1e9;
  std::fprintf(stderr, "model: %s, %lld routed experts stored a layer; copy %.0f GB/s; building weights ...\n",
               c.Summary().c_str(), static_cast<long long>(experts), copy_gbs);
  const auto t0 = Clock::now();
  SyntheticWeights synthetic(c, experts);
  absl::StatusOr<std::unique_ptr<cuda_v4::CudaV4Model>> model = cuda_v4::CudaV4Model::Create(
      c, synthetic.weights(), {.shared_expert_beside = !shared_serial});
  if (!model.ok()) {
    std::fprintf(stderr, "v4_cuda_decode_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  cuda_v4::CudaV4Model& m = **model;
  std::fprintf(stderr, "weights on the GPU: %.1f GiB (%lld FP8, %lld FP4, %lld bf16 matrices) in %.0f s\n",
               m.weight_bytes() / 1073741824.0, static_cast<long long>(m.fp8_matrices()),
               static_cast<long long>(m.fp4_matrices()), static_cast<long long>(m.bf16_matrices()),
               bench::SecondsBetween(t0, Clock::now()));
  const uint64_t checkpoint_bytes = bench_bytes::WeightBytesPerToken(c, synthetic.weights(), /*fp4_as_stored=*/true);
  const uint64_t engine_bytes = EngineBytes(c, synthetic.weights());

  const int64_t block = 64,
                most = std::max(*std::max_element(contexts.begin(), contexts.end()) + steps + 8, prefill);
  const int64_t blocks = (most + block - 1) / block;
  absl::Status pooled = m.EnsurePool({.num_layers = static_cast<int32_t>(c.num_hidden_layers),
                                      .block_size = static_cast<int32_t>(block), .num_blocks = blocks,
                                      .num_sequence_slots = 1});
  if (!pooled.ok()) {
    std::fprintf(stderr, "v4_cuda_decode_bench: %s\n", std::string(pooled.message()).c_str());
    return 1;
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  bool finite = true;
  nlohmann::ordered_json prefill_json;
  if (prefill > 0) {
    const int64_t chunk = prefill_chunk > 0 ? std::min(prefill_chunk, prefill) : prefill;
    std::vector<int32_t> prompt(static_cast<size_t>(prefill));
    for (int64_t i = 0; i < prefill; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 50000 + 10);
    // Seconds for the whole prompt, chunk after chunk; the last chunk's logits only.
    auto run = [&](bool fp8) -> double {
      m.set_fp8_gemm(fp8);
      const auto t = Clock::now();
      for (int64_t at = 0; at < prefill; at += chunk) {
        const int64_t n = std::min(chunk, prefill - at);
        const ForwardSequence q{.tokens = std::span(prompt).subspan(static_cast<size_t>(at), static_cast<size_t>(n)),
                                .start_position = at, .block_table = table, .no_logits = at + n < prefill,
                                .state_slot = 0};
        absl::StatusOr<std::vector<float>> logits = m.Forward({&q, 1});
        if (!logits.ok()) {
          std::fprintf(stderr, "v4_cuda_decode_bench: prefill: %s\n", std::string(logits.status().message()).c_str());
          return -1.0;
        }
        for (float v : *logits) finite = finite && std::isfinite(v);
      }
      return bench::SecondsBetween(t, Clock::now());
    };
    std::vector<double> f32_s, fp8_s;
    const int64_t gemms_before = m.fp8_gemms();
    for (int r = 0; r < 4; ++r) {  // the first of each untimed (allocation, cuBLAS's first calls)
      const double a = run(false), b = run(true);
      if (a < 0 || b < 0) return 1;
      if (r > 0) {
        f32_s.push_back(a);
        fp8_s.push_back(b);
      }
    }
    m.set_fp8_gemm(false);
    const double lt_rate = CublasLtFp8Rate(static_cast<int>(std::min<int64_t>(prefill, 8192)));
    const double flops = 2.0 * static_cast<double>(LinearElementsPerToken(c, synthetic.weights())) * prefill;
    const double f32 = bench::Percentile(f32_s, 0.5), fp8 = bench::Percentile(fp8_s, 0.5);
    std::fprintf(stderr,
                 "prefill %lld tokens in chunks of %lld: FP8 GEMMs %.1f ms (%.0f tokens/s, %.3f of cuBLASLt's FP8 rate "
                 "%.0f TFLOP/s), float32 %.1f ms (%.3f); %lld FP8 GEMMs a prefill\n",
                 static_cast<long long>(prefill), static_cast<long long>(chunk), fp8 * 1e3, prefill / fp8,
                 flops / fp8 / lt_rate, lt_rate / 1e12, f32 * 1e3, flops / f32 / lt_rate,
                 static_cast<long long>((m.fp8_gemms() - gemms_before) / 4));
    prefill_json = {{"tokens", prefill},
                    {"chunk", chunk},
                    {"linear_flops", flops},
                    {"cublaslt_fp8_tflops", lt_rate / 1e12},
                    {"fp8_gemm_ms_p50", fp8 * 1e3},
                    {"float32_ms_p50", f32 * 1e3},
                    {"fp8_gemm_fraction_of_cublaslt_fp8", flops / fp8 / lt_rate},
                    {"float32_fraction_of_cublaslt_fp8", flops / f32 / lt_rate},
                    {"fp8_gemms_per_prefill", (m.fp8_gemms() - gemms_before) / 4}};
  }
  // Median seconds of `steps` decode steps at context n (after 3 untimed ones: the first
  // pass of a launch layout runs eagerly, the second is captured).
  auto measure = [&](int64_t n, bool graphs, std::vector<double>& step_s) -> bool {
    m.set_cuda_graphs(graphs);
    int32_t token = 5;
    for (int s = 0; s < steps + 3; ++s) {
      const ForwardSequence q{.tokens = {&token, 1}, .start_position = n + s, .block_table = table, .state_slot = 0};
      const bool profiled = profile && graphs && n == contexts.front() && s == steps + 2;
      if (profiled) cudaProfilerStart();
      const auto s0 = Clock::now();
      absl::StatusOr<std::vector<float>> logits = m.Forward({&q, 1});
      if (profiled) cudaProfilerStop();
      if (s >= 3) step_s.push_back(bench::SecondsBetween(s0, Clock::now()));
      if (!logits.ok()) {
        std::fprintf(stderr, "v4_cuda_decode_bench: %s\n", std::string(logits.status().message()).c_str());
        return false;
      }
      for (float v : *logits) finite = finite && std::isfinite(v);
      token = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    }
    return true;
  };
  for (const int64_t n : contexts) {
    std::vector<double> step_s, eager_s;
    const int64_t replays = m.graph_replays();
    if (!measure(n, true, step_s)) return 1;
    const int64_t replayed = m.graph_replays() - replays;
    if (eager_too && !measure(n, false, eager_s)) return 1;
    const double median = bench::Percentile(step_s, 0.5);
    const double kv = bench_bytes::KvBytesPerToken(c, n);
    const double roof = (static_cast<double>(checkpoint_bytes) + kv) / median / (copy_gbs * 1e9);
    const double engine = (static_cast<double>(engine_bytes) + kv) / median / (copy_gbs * 1e9);
    std::fprintf(stderr, "context %7lld: %.2f ms a step, %.1f tokens/s, %.3f of the roofline (%.3f of the engine's bytes)"
                 "; %lld of %d steps replayed from graphs\n",
                 static_cast<long long>(n), median * 1e3, 1.0 / median, roof, engine, static_cast<long long>(replayed),
                 steps + 3);
    if (!eager_s.empty()) {
      std::fprintf(stderr, "context %7lld without graphs: %.2f ms a step (graphs: %.3fx as fast)\n",
                   static_cast<long long>(n), 1e3 * bench::Percentile(eager_s, 0.5),
                   bench::Percentile(eager_s, 0.5) / median);
    }
    results.push_back({{"context", n},
                       {"step_ms", {{"p50", 1e3 * median}, {"p90", 1e3 * bench::Percentile(step_s, 0.9)}}},
                       {"tokens_per_s", 1.0 / median},
                       {"kv_bytes_per_step", kv},
                       {"fraction_of_roofline", roof},
                       {"fraction_of_engine_bytes", engine},
                       {"steps_replayed_from_graphs", replayed},
                       {"eager_step_ms_p50", eager_s.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(1e3 * bench::Percentile(eager_s, 0.5))}});
  }
  nlohmann::ordered_json out = {
      {"benchmark", "v4_cuda_decode_batch1"},
      {"config", config_path},
      {"model_summary", c.Summary()},
      {"routed_experts_stored", experts},
      {"shared_expert", shared_serial ? "serial" : "beside"},
      {"shared_expert_branches", m.shared_expert_branches()},
      {"weights_on_gpu_bytes", m.weight_bytes()},
      {"checkpoint_bytes_per_step", checkpoint_bytes},
      {"engine_bytes_per_step", engine_bytes},
      {"reference_copy_gbs", copy_gbs},
      {"logits_finite", finite},
      {"results", results},
      {"prefill", prefill_json},
      {"goal_reference", "roofline: (checkpoint-format weight bytes + float32 KV bytes a step reads) / the same run's "
                         "device copy rate (bytes read + written per second)"},
  };
  const std::string text = out.dump(2);
  std::printf("%s\n", text.c_str());
  if (!json_path.empty()) {
    if (std::FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fprintf(f, "%s\n", text.c_str());
      std::fclose(f);
    }
  }
  return finite ? 0 : 1;
}

}  // namespace
}  // namespace tandem::v4

int main(int argc, char** argv) { return tandem::v4::Main(argc, argv); }
