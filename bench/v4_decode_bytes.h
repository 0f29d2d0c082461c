// The bytes one DeepSeek-V4 decode step reads, for the decode benchmarks' rooflines
// (v4_cpu_decode_bench, v4_cuda_decode_bench): its embedding row, every attention weight
// (q, the shared K=V head, the grouped output projection, the compressors' and the
// indexer's projections), the mHC mixing weights, the router and the experts the token is
// routed to (hash layers: tid2eid's; top-k layers: num_experts_per_tok, counted as the
// first experts' sizes, all equal), the shared expert, the hyper head and the LM head; and
// the KV read: the sliding window's ring, every indexer key of CSA layers (the indexer
// scores them all), the index_topk entries CSA attention reads, every HCA entry.
#pragma once

#include <algorithm>
#include <cstdint>

#include "bench/read_bandwidth.h"
#include "engine/model/deepseek_v4/v4_weights.h"

namespace tandem::v4::bench_bytes {

// A matrix as the checkpoint stores it (fp4_as_stored: FP4 experts at half a byte a value
// plus a one-byte ue8m0 scale per 32, not the CPU's bf16 widening).
inline uint64_t MatrixBytes(const cpu::WeightMatrix& w, bool fp4_as_stored) {
  if (fp4_as_stored && w.fp4_codes != nullptr) {
    return static_cast<uint64_t>(w.rows) * w.cols / 2 + static_cast<uint64_t>(w.rows) * (w.cols / 32);
  }
  return bench::MatrixBytes(w);
}

inline uint64_t ExpertBytes(const ExpertWeights& e, bool fp4) {
  return MatrixBytes(e.gate, fp4) + MatrixBytes(e.up, fp4) + MatrixBytes(e.down, fp4);
}

inline uint64_t CompressorBytes(const CompressorWeights& c, bool fp4) {
  return MatrixBytes(c.kv_proj, fp4) + MatrixBytes(c.gate_proj, fp4);
}

inline uint64_t WeightBytesPerToken(const DeepseekV4Config& c, const ModelWeights& w, bool fp4_as_stored = false) {
  const bool f = fp4_as_stored;
  uint64_t bytes = static_cast<uint64_t>(c.hidden_size) * DTypeSize(w.embed.dtype);
  for (const LayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attention;
    bytes += MatrixBytes(a.q_a_proj, f) + MatrixBytes(a.q_b_proj, f) + MatrixBytes(a.kv_proj, f) +
             MatrixBytes(a.o_b_proj, f);
    for (const cpu::WeightMatrix& g : a.o_a_groups) bytes += MatrixBytes(g, f);
    if (a.compressor) bytes += CompressorBytes(*a.compressor, f);
    if (a.indexer) {
      bytes += CompressorBytes(a.indexer->compressor, f) + MatrixBytes(a.indexer->q_b_proj, f) +
               MatrixBytes(a.indexer->weights_proj, f);
    }
    bytes += MatrixBytes(l.attn_hc.fn, f) + MatrixBytes(l.ffn_hc.fn, f) + MatrixBytes(l.moe.router, f);
    bytes += c.num_experts_per_tok * ExpertBytes(l.moe.experts[0], f) + ExpertBytes(l.moe.shared, f);
  }
  return bytes + MatrixBytes(w.hc_head.fn, f) + MatrixBytes(w.head, f);
}

// KV bytes one decode step reads at context n (float32 entries, as both engines store them).
inline double KvBytesPerToken(const DeepseekV4Config& c, int64_t n) {
  double bytes = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    bytes += static_cast<double>(std::min(n, c.sliding_window)) * c.head_dim * 4;
    const int64_t rate = c.CompressRate(l);
    if (rate == 0) continue;
    const int64_t entries = n / rate;
    if (c.layer_types[l] == AttentionType::kCompressedSparse) {
      bytes += static_cast<double>(entries) * c.index_head_dim * 4;
      bytes += static_cast<double>(std::min(entries, c.index_topk)) * c.head_dim * 4;
    } else {
      bytes += static_cast<double>(entries) * c.head_dim * 4;
    }
  }
  return bytes;
}

}  // namespace tandem::v4::bench_bytes
