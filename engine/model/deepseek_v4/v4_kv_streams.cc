#include "engine/model/deepseek_v4/v4_kv_streams.h"

#include <cstdint>

namespace tandem::v4 {

std::vector<KvStream> KvStreamsFor(const DeepseekV4Config& c, bool mtp) {
  std::vector<int32_t> all, csa, hca;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    all.push_back(static_cast<int32_t>(l));
    if (c.layer_types[l] == AttentionType::kCompressedSparse) csa.push_back(static_cast<int32_t>(l));
    if (c.layer_types[l] == AttentionType::kHeavilyCompressed) hca.push_back(static_cast<int32_t>(l));
  }
  if (mtp) all.push_back(static_cast<int32_t>(c.num_hidden_layers));
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  const int64_t m = c.compress_rate_csa, mh = c.compress_rate_hca;
  std::vector<KvStream> streams;
  streams.push_back({.name = "window", .dtype = "f32", .granularity = KvGranularity::kRing,
                     .tokens = i32(c.sliding_window), .width = i32(c.head_dim), .layers = all});
  if (!csa.empty()) {
    streams.push_back({.name = "csa_entries", .dtype = "f32", .granularity = KvGranularity::kPerWindow,
                       .tokens = i32(m), .width = i32(c.head_dim), .layers = csa});
    streams.push_back({.name = "csa_index_keys", .dtype = "f32", .granularity = KvGranularity::kPerWindow,
                       .tokens = i32(m), .width = i32(c.index_head_dim), .layers = csa});
  }
  if (!hca.empty()) {
    streams.push_back({.name = "hca_entries", .dtype = "f32", .granularity = KvGranularity::kPerWindow,
                       .tokens = i32(mh), .width = i32(c.head_dim), .layers = hca});
  }
  if (!csa.empty()) {
    streams.push_back({.name = "csa_compressor", .dtype = "f32", .granularity = KvGranularity::kSequenceState,
                       .tokens = i32(6 * m - 4), .width = i32(c.head_dim), .layers = csa});
    streams.push_back({.name = "csa_indexer", .dtype = "f32", .granularity = KvGranularity::kSequenceState,
                       .tokens = i32(6 * m - 4), .width = i32(c.index_head_dim), .layers = csa});
  }
  if (!hca.empty()) {
    streams.push_back({.name = "hca_compressor", .dtype = "f32", .granularity = KvGranularity::kSequenceState,
                       .tokens = i32(2 * (mh - 1)), .width = i32(c.head_dim), .layers = hca});
  }
  if (mtp) {
    streams.push_back({.name = "mtp_hidden", .dtype = "f32", .granularity = KvGranularity::kSequenceState,
                       .tokens = i32(c.hc_mult), .width = i32(c.hidden_size),
                       .layers = {i32(c.num_hidden_layers)}});
  }
  return streams;
}

}  // namespace tandem::v4
