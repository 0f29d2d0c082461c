#include "engine/model/deepseek_v4/cuda/cuda_v4_plan.h"

#include <algorithm>

#include "kernels/common/check.h"

namespace tandem::v4::cuda_v4 {
namespace {

float* F(std::byte* p) { return reinterpret_cast<float*>(p); }

// Where entry e of a per-window stream of `rate` tokens lives, as a row of its layer's
// region (KvPool::Entry's arithmetic: the block of the window's last token).
int64_t EntryRow(std::span<const int32_t> table, int64_t e, int64_t rate, int64_t block_size) {
  const int64_t last = (e + 1) * rate - 1;
  const int64_t per_block = rate <= block_size ? block_size / rate : 1;
  const int64_t slot = rate <= block_size ? e % per_block : 0;
  return static_cast<int64_t>(table[static_cast<size_t>(last / block_size)]) * per_block + slot;
}

// One compressor's geometry and the places of one sequence's state for it.
struct Geometry {
  int64_t rate = 0, width = 0, proj = 0;
  bool overlap = false;
  int64_t x_col = 0;  // the kv rows' first column in x_proj's output; the gates follow
  const float* bias = nullptr;
};

struct SequenceView {
  int64_t p0 = 0, n1 = 0, row0 = 0;
  float* partial_kv = nullptr;
  float* partial_gate = nullptr;
  float* overlap_kv = nullptr;
  float* overlap_gate = nullptr;
  std::span<const int32_t> table;
};

void PlanCompressor(const Geometry& g, const SequenceView& s, const PlanBuffers& b, int64_t x_stride,
                    KvPool& pool, int stream, int32_t layer, CompressorJob* job) {
  const int64_t half = g.overlap ? g.width : 0;
  auto kv_row = [&](int64_t pos) -> const float* {
    if (pos >= s.p0) return b.x_proj + (s.row0 + pos - s.p0) * x_stride + g.x_col;
    return s.partial_kv + (pos % g.rate) * g.proj;
  };
  auto gate_row = [&](int64_t pos) -> const float* {
    if (pos >= s.p0) return b.x_proj + (s.row0 + pos - s.p0) * x_stride + g.x_col + g.proj;
    return s.partial_gate + (pos % g.rate) * g.proj;
  };
  const int64_t first = s.p0 / g.rate, end = s.n1 / g.rate;  // windows closing in this pass
  for (int64_t e = first; e < end; ++e) {
    std::vector<cuda::CompressorSlot> slots;
    if (g.overlap && e > 0) {
      for (int64_t j = 0; j < g.rate; ++j) {
        if (e - 1 >= first) {  // the previous window closed in this pass too: its Ca half
          const int64_t pos = (e - 1) * g.rate + j;
          slots.push_back({kv_row(pos), gate_row(pos), g.bias + j * g.proj});
        } else {  // it closed before: the state's overlap rows, gates already biased
          slots.push_back({s.overlap_kv + j * g.width, s.overlap_gate + j * g.width, nullptr});
        }
      }
    }
    for (int64_t j = 0; j < g.rate; ++j) {
      const int64_t pos = e * g.rate + j;
      slots.push_back({kv_row(pos) + half, gate_row(pos) + half, g.bias + j * g.proj + half});
    }
    job->num_slots.push_back(static_cast<int32_t>(slots.size()));
    slots.resize(static_cast<size_t>(job->max_slots));
    job->slots.insert(job->slots.end(), slots.begin(), slots.end());
    job->positions.push_back(static_cast<int32_t>(e * g.rate));
    job->out.push_back(F(pool.Entry(stream, layer, s.table, e * g.rate)));
  }
  if (g.overlap && end > first) {  // the overlap half becomes the last closed window's
    const int64_t last = end - 1;
    for (int64_t j = 0; j < g.rate; ++j) {
      const int64_t pos = last * g.rate + j;
      job->overlap_copies.push_back({kv_row(pos), nullptr, s.overlap_kv + j * g.width});
      job->overlap_copies.push_back({gate_row(pos), g.bias + j * g.proj, s.overlap_gate + j * g.width});
    }
  }
  // The unfinished window's rows that this pass brought; older ones are in place already.
  for (int64_t pos = std::max(s.p0, end * g.rate); pos < s.n1; ++pos) {
    job->partial_copies.push_back({kv_row(pos), nullptr, s.partial_kv + (pos % g.rate) * g.proj});
    job->partial_copies.push_back({gate_row(pos), nullptr, s.partial_gate + (pos % g.rate) * g.proj});
  }
}

// The state rows of a compressor in its per-sequence stream (v4_pool_state.cc's layout):
// unfinished kv, unfinished gates ((rate - 1) x proj each), overlap kv, overlap gates
// (rate x width each, overlapping compressors only).
void StateRows(const Geometry& g, float* rows, SequenceView* s) {
  const int64_t partial = (g.rate - 1) * g.proj;
  s->partial_kv = rows;
  s->partial_gate = rows + partial;
  s->overlap_kv = g.overlap ? rows + 2 * partial : nullptr;
  s->overlap_gate = g.overlap ? rows + 2 * partial + g.rate * g.width : nullptr;
}

}  // namespace

StepPlan BuildStepPlan(const DeepseekV4Config& c, const CudaV4Weights& w, std::span<const ForwardSequence> batch,
                       KvPool& pool, const PlanBuffers& b) {
  StepPlan plan;
  const int64_t bs = pool.geometry().block_size, win = c.sliding_window, d = c.head_dim;
  const int st_window = pool.StreamIndex("window"), st_csa = pool.StreamIndex("csa_entries"),
            st_keys = pool.StreamIndex("csa_index_keys"), st_hca = pool.StreamIndex("hca_entries"),
            st_csa_state = pool.StreamIndex("csa_compressor"), st_idx_state = pool.StreamIndex("csa_indexer"),
            st_hca_state = pool.StreamIndex("hca_compressor");
  TANDEM_CHECK_GE(st_window, 0);

  for (size_t q = 0; q < batch.size(); ++q) {
    const ForwardSequence& s = batch[q];
    const int64_t n = static_cast<int64_t>(s.tokens.size()), p0 = s.start_position;
    plan.seq_start.push_back(static_cast<int32_t>(p0));
    plan.seq_row0.push_back(static_cast<int32_t>(plan.rows));
    for (int64_t t = 0; t < n; ++t) {
      plan.tokens.push_back(s.tokens[static_cast<size_t>(t)]);
      plan.positions.push_back(static_cast<int32_t>(p0 + t));
      plan.token_seq.push_back(static_cast<int32_t>(q));
    }
    if (!s.no_logits) {
      for (int64_t t = s.all_logits ? 0 : n - 1; t < n; ++t) plan.logits_rows.push_back(static_cast<int32_t>(plan.rows + t));
    }
    plan.rows += n;
    auto entries = [&](int64_t rate, std::vector<int32_t>* count, std::vector<int64_t>* begin,
                       std::vector<int64_t>* rows, int64_t* max_entries) {
      const int64_t k = rate > 0 ? (p0 + n) / rate : 0;
      count->push_back(static_cast<int32_t>(k));
      begin->push_back(static_cast<int64_t>(rows->size()));
      for (int64_t e = 0; e < k; ++e) rows->push_back(EntryRow(s.block_table, e, rate, bs));
      *max_entries = std::max(*max_entries, k);
    };
    entries(st_csa >= 0 ? c.compress_rate_csa : 0, &plan.seq_entries_csa, &plan.seq_entry_begin_csa,
            &plan.entry_rows_csa, &plan.max_entries_csa);
    entries(st_hca >= 0 ? c.compress_rate_hca : 0, &plan.seq_entries_hca, &plan.seq_entry_begin_hca,
            &plan.entry_rows_hca, &plan.max_entries_hca);
  }

  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    const AttentionType type = c.layer_types[static_cast<size_t>(l)];
    const CudaV4Layer& lw = w.layers[static_cast<size_t>(l)];
    LayerPlan lp;
    const bool csa = type == AttentionType::kCompressedSparse;
    if (type != AttentionType::kSliding) {
      lp.entries = F(pool.Page(csa ? st_csa : st_hca, l, 0).data());
      if (csa) lp.index_keys = F(pool.Page(st_keys, l, 0).data());
    }
    const Geometry main{.rate = c.CompressRate(type), .width = d, .proj = csa ? 2 * d : d, .overlap = csa,
                        .x_col = lw.x_cols.compressor, .bias = lw.compressor.position_bias};
    const Geometry indexer{.rate = c.compress_rate_csa, .width = c.index_head_dim, .proj = 2 * c.index_head_dim,
                           .overlap = true, .x_col = lw.x_cols.indexer_compressor,
                           .bias = lw.indexer_compressor.position_bias};
    lp.main.max_slots = static_cast<int>(main.overlap ? 2 * main.rate : main.rate);
    lp.indexer.max_slots = static_cast<int>(2 * indexer.rate);
    for (size_t q = 0; q < batch.size(); ++q) {
      const ForwardSequence& s = batch[q];
      const int64_t n = static_cast<int64_t>(s.tokens.size()), p0 = s.start_position, row0 = plan.seq_row0[q];
      float* ring = F(pool.SequenceRows(st_window, l, s.state_slot).data());
      lp.seq_ring.push_back(ring);
      for (int64_t pos = std::max(p0, p0 + n - win); pos < p0 + n; ++pos) {
        lp.ring_copies.push_back({b.kv + (row0 + pos - p0) * d, nullptr, ring + (pos % win) * d});
      }
      if (type == AttentionType::kSliding) continue;
      SequenceView view{.p0 = p0, .n1 = p0 + n, .row0 = row0, .table = s.block_table};
      StateRows(main, F(pool.SequenceRows(csa ? st_csa_state : st_hca_state, l, s.state_slot).data()), &view);
      PlanCompressor(main, view, b, lw.x_cols.width, pool, csa ? st_csa : st_hca, l, &lp.main);
      if (csa) {
        StateRows(indexer, F(pool.SequenceRows(st_idx_state, l, s.state_slot).data()), &view);
        PlanCompressor(indexer, view, b, lw.x_cols.width, pool, st_keys, l, &lp.indexer);
      }
    }
    plan.layers.push_back(std::move(lp));
  }
  return plan;
}

}  // namespace tandem::v4::cuda_v4
