#include "engine/model/deepseek_v4/v4_pool_state.h"

#include <cstring>

#include "kernels/common/check.h"

namespace tandem::v4 {
namespace {

struct Streams {
  int window, csa_entries, csa_index_keys, hca_entries, csa_compressor, csa_indexer, hca_compressor;
};

Streams Find(const KvPool& pool) {
  auto at = [&](const char* name, bool needed) {
    const int i = pool.StreamIndex(name);
    TANDEM_CHECK(i >= 0 || !needed) << "the KV pool has no stream '" << name << "'";
    return i;
  };
  return {at("window", true),          at("csa_entries", false), at("csa_index_keys", false),
          at("hca_entries", false),    at("csa_compressor", false), at("csa_indexer", false),
          at("hca_compressor", false)};
}

// The compressor state's rows in its stream: the unfinished window's kv, then its gate
// (each (rate - 1) x proj_width values), then the overlap half's kv and gate (rate x width
// each). The bytes past partial_tokens rows are stale in the state and never read.
struct StateRows {
  size_t partial, overlap;  // floats
};
StateRows RowsOf(const CompressorState& s) {
  return {static_cast<size_t>((s.rate - 1) * s.proj_width), static_cast<size_t>(s.rate * s.width)};
}

void CopyCompressorOut(const CompressorState& s, std::span<std::byte> rows) {
  const StateRows r = RowsOf(s);
  float* out = reinterpret_cast<float*>(rows.data());
  TANDEM_CHECK_EQ(rows.size(), (2 * r.partial + (s.overlap_kv.empty() ? 0 : 2 * r.overlap)) * sizeof(float));
  const size_t n = static_cast<size_t>(s.partial_tokens * s.proj_width);
  std::memcpy(out, s.partial_kv.data(), n * sizeof(float));
  std::memcpy(out + r.partial, s.partial_gate.data(), n * sizeof(float));
  if (s.has_overlap) {
    std::memcpy(out + 2 * r.partial, s.overlap_kv.data(), r.overlap * sizeof(float));
    std::memcpy(out + 2 * r.partial + r.overlap, s.overlap_gate.data(), r.overlap * sizeof(float));
  }
}

void CopyCompressorIn(std::span<const std::byte> rows, int64_t num_tokens, CompressorState* s) {
  const StateRows r = RowsOf(*s);
  const float* in = reinterpret_cast<const float*>(rows.data());
  s->num_entries = num_tokens / s->rate;
  s->partial_tokens = num_tokens % s->rate;
  const size_t n = static_cast<size_t>(s->partial_tokens * s->proj_width);
  std::memcpy(s->partial_kv.data(), in, n * sizeof(float));
  std::memcpy(s->partial_gate.data(), in + r.partial, n * sizeof(float));
  s->has_overlap = !s->overlap_kv.empty() && s->num_entries > 0;
  if (s->has_overlap) {
    std::memcpy(s->overlap_kv.data(), in + 2 * r.partial, r.overlap * sizeof(float));
    std::memcpy(s->overlap_gate.data(), in + 2 * r.partial + r.overlap, r.overlap * sizeof(float));
  }
}

void StoreEntries(const CompressorState& s, int64_t from_token, int stream, int32_t layer, KvPool& pool,
                  std::span<const int32_t> table) {
  const size_t bytes = static_cast<size_t>(s.width) * sizeof(float);
  for (int64_t e = from_token / s.rate; e < s.num_entries; ++e) {
    std::memcpy(pool.Entry(stream, layer, table, e * s.rate), &s.entries[e * s.width], bytes);
  }
}

void LoadEntries(int stream, int32_t layer, KvPool& pool, std::span<const int32_t> table, CompressorState* s) {
  const size_t bytes = static_cast<size_t>(s->width) * sizeof(float);
  s->entries.resize(static_cast<size_t>(s->num_entries * s->width));
  for (int64_t e = 0; e < s->num_entries; ++e) {
    std::memcpy(&s->entries[e * s->width], pool.Entry(stream, layer, table, e * s->rate), bytes);
  }
}

}  // namespace

void StoreState(const DeepseekV4Config& c, const SequenceState& state, int64_t from_token, KvPool& pool,
                std::span<const int32_t> table, int64_t slot) {
  const Streams st = Find(pool);
  TANDEM_CHECK_EQ(static_cast<int64_t>(state.layers.size()), c.num_hidden_layers);
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerState& ls = state.layers[l];
    std::span<std::byte> ring = pool.SequenceRows(st.window, l, slot);
    TANDEM_CHECK_EQ(ring.size(), ls.window.size() * sizeof(float));
    std::memcpy(ring.data(), ls.window.data(), ring.size());
    if (!ls.compressor) continue;
    const bool csa = c.layer_types[l] == AttentionType::kCompressedSparse;
    StoreEntries(*ls.compressor, from_token, csa ? st.csa_entries : st.hca_entries, l, pool, table);
    CopyCompressorOut(*ls.compressor, pool.SequenceRows(csa ? st.csa_compressor : st.hca_compressor, l, slot));
    if (ls.indexer) {
      StoreEntries(*ls.indexer, from_token, st.csa_index_keys, l, pool, table);
      CopyCompressorOut(*ls.indexer, pool.SequenceRows(st.csa_indexer, l, slot));
    }
  }
}

void LoadState(const DeepseekV4Config& c, KvPool& pool, std::span<const int32_t> table, int64_t slot,
               int64_t num_tokens, SequenceState* state) {
  const Streams st = Find(pool);
  TANDEM_CHECK_EQ(static_cast<int64_t>(state->layers.size()), c.num_hidden_layers);
  state->num_tokens = num_tokens;
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerState& ls = state->layers[l];
    std::span<std::byte> ring = pool.SequenceRows(st.window, l, slot);
    TANDEM_CHECK_EQ(ring.size(), ls.window.size() * sizeof(float));
    std::memcpy(ls.window.data(), ring.data(), ring.size());
    if (!ls.compressor) continue;
    const bool csa = c.layer_types[l] == AttentionType::kCompressedSparse;
    CopyCompressorIn(pool.SequenceRows(csa ? st.csa_compressor : st.hca_compressor, l, slot), num_tokens,
                     &*ls.compressor);
    LoadEntries(csa ? st.csa_entries : st.hca_entries, l, pool, table, &*ls.compressor);
    if (ls.indexer) {
      CopyCompressorIn(pool.SequenceRows(st.csa_indexer, l, slot), num_tokens, &*ls.indexer);
      LoadEntries(st.csa_index_keys, l, pool, table, &*ls.indexer);
    }
  }
}

void StoreMtpRing(const DeepseekV4Config& c, const LayerState& ring, KvPool& pool, int64_t slot) {
  std::span<std::byte> rows = pool.SequenceRows(Find(pool).window, static_cast<int32_t>(c.num_hidden_layers), slot);
  TANDEM_CHECK_EQ(rows.size(), ring.window.size() * sizeof(float));
  std::memcpy(rows.data(), ring.window.data(), rows.size());
}

void LoadMtpRing(const DeepseekV4Config& c, KvPool& pool, int64_t slot, LayerState* ring) {
  std::span<std::byte> rows = pool.SequenceRows(Find(pool).window, static_cast<int32_t>(c.num_hidden_layers), slot);
  TANDEM_CHECK_EQ(rows.size(), ring->window.size() * sizeof(float));
  std::memcpy(ring->window.data(), rows.data(), rows.size());
}

namespace {

std::span<std::byte> HiddenRows(const DeepseekV4Config& c, KvPool& pool, int64_t slot) {
  const int s = pool.StreamIndex("mtp_hidden");
  TANDEM_CHECK_GE(s, 0) << "the KV pool has no stream 'mtp_hidden'";
  std::span<std::byte> rows = pool.SequenceRows(s, static_cast<int32_t>(c.num_hidden_layers), slot);
  TANDEM_CHECK_EQ(rows.size(), static_cast<size_t>(c.hc_mult * c.hidden_size) * sizeof(float));
  return rows;
}

}  // namespace

void StoreLastHidden(const DeepseekV4Config& c, std::span<const float> hidden, KvPool& pool, int64_t slot) {
  std::span<std::byte> rows = HiddenRows(c, pool, slot);
  TANDEM_CHECK_EQ(hidden.size_bytes(), rows.size());
  std::memcpy(rows.data(), hidden.data(), rows.size());
}

std::vector<float> LoadLastHidden(const DeepseekV4Config& c, KvPool& pool, int64_t slot) {
  std::span<std::byte> rows = HiddenRows(c, pool, slot);
  std::vector<float> hidden(rows.size() / sizeof(float));
  std::memcpy(hidden.data(), rows.data(), rows.size());
  return hidden;
}

}  // namespace tandem::v4
