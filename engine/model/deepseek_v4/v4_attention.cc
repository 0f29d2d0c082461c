#include "engine/model/deepseek_v4/v4_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <span>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cpu/vec.h"

namespace tandem::v4 {
namespace {

// round: AttentionParams::round_fp8_input.
cpu::MatmulParams Projection(const WeightMatrix& w, const float* x, int64_t rows, int64_t x_stride, float* y,
                             bool round) {
  return {.x = x, .m = rows, .x_stride = x_stride, .w = &w, .y = y, .y_stride = w.rows, .round_fp8_input = round};
}

void Project(const WeightMatrix& w, const float* x, int64_t rows, int64_t x_stride, float* y, bool round,
             cpu::ThreadPool& pool) {
  cpu::Matmul(Projection(w, x, rows, x_stride, y, round), pool);
}

// Independent projections in one fork-join (cpu::MatmulBatch: the same bits).
void ProjectAll(std::initializer_list<cpu::MatmulParams> jobs, cpu::ThreadPool& pool) {
  cpu::MatmulBatch(std::span<const cpu::MatmulParams>(jobs.begin(), jobs.size()), pool);
}

// The geometry of one compressor (a layer's main one, or a CSA layer's indexer).
struct Compressor {
  const CompressorWeights* w = nullptr;
  const Rope* rope = nullptr;
  int64_t width = 0;       // entry width
  int64_t proj_width = 0;  // 2 * width when windows overlap
  int64_t rate = 0;
  bool overlap = false;
  float eps = 0.0f;

  // gate + position bias of a window's j-th token, all proj_width channels.
  void BiasGate(const float* gate, int64_t j, float* out) const {
    const float* bias = w->position_bias + j * proj_width;
    for (int64_t i = 0; i < proj_width; ++i) out[i] = gate[i] + bias[i];
  }

  // Window `index`'s entry from its slots: the previous window's Ca half (kv rows and
  // biased gates, `prev_*`, null when there is none) and this window's own rows (the Cb
  // half when windows overlap).
  void Emit(const float* prev_kv, int64_t prev_kv_stride, const float* prev_gate, const float* kv, const float* gate,
            int64_t index, float* out) const {
    std::vector<const float*> kv_slots(static_cast<size_t>(2 * rate)), gate_slots(kv_slots.size());
    int64_t slots = 0;
    if (overlap && prev_kv != nullptr) {
      for (int64_t j = 0; j < rate; ++j, ++slots) {
        kv_slots[slots] = prev_kv + j * prev_kv_stride;
        gate_slots[slots] = prev_gate + j * width;
      }
    }
    const int64_t half = overlap ? width : 0;
    for (int64_t j = 0; j < rate; ++j, ++slots) {
      kv_slots[slots] = kv + j * proj_width + half;
      gate_slots[slots] = gate + j * proj_width + half;
    }
    PoolWindow(kv_slots.data(), gate_slots.data(), slots, width, out);
    cpu::RmsNorm(out, 1, width, width, w->norm, eps, out, width);
    rope->Apply(out, width, index * rate, /*inverse=*/false);
  }

  // The full form: every complete window of rows [0, rows) of kv/gate [rows][proj_width].
  std::vector<float> PoolAll(const float* kv, const float* gate, int64_t rows) const {
    const int64_t windows = rows / rate;
    std::vector<float> entries(static_cast<size_t>(windows * width));
    std::vector<float> biased(static_cast<size_t>(windows * rate * proj_width));
    for (int64_t r = 0; r < windows * rate; ++r) BiasGate(gate + r * proj_width, r % rate, &biased[r * proj_width]);
    // The previous window's Ca gates, compacted to width columns as the state keeps them.
    std::vector<float> prev_gate(static_cast<size_t>(rate * width));
    for (int64_t w = 0; w < windows; ++w) {
      const float* prev_kv = nullptr;
      if (overlap && w > 0) {
        prev_kv = kv + (w - 1) * rate * proj_width;
        for (int64_t j = 0; j < rate; ++j) {
          std::memcpy(&prev_gate[j * width], &biased[((w - 1) * rate + j) * proj_width], width * sizeof(float));
        }
      }
      Emit(prev_kv, proj_width, prev_gate.data(), kv + w * rate * proj_width, &biased[w * rate * proj_width], w,
           &entries[w * width]);
    }
    return entries;
  }

  // The incremental form: one more token's rows into the unfinished window, closing it
  // into an entry when it is full.
  void Append(CompressorState& s, const float* kv, const float* gate) const {
    std::memcpy(&s.partial_kv[s.partial_tokens * proj_width], kv, proj_width * sizeof(float));
    std::memcpy(&s.partial_gate[s.partial_tokens * proj_width], gate, proj_width * sizeof(float));
    if (++s.partial_tokens < rate) return;
    std::vector<float> biased(static_cast<size_t>(rate * proj_width));
    for (int64_t j = 0; j < rate; ++j) BiasGate(&s.partial_gate[j * proj_width], j, &biased[j * proj_width]);
    s.entries.resize(static_cast<size_t>((s.num_entries + 1) * width));
    Emit(s.has_overlap ? s.overlap_kv.data() : nullptr, width, s.overlap_gate.data(), s.partial_kv.data(),
         biased.data(), s.num_entries, &s.entries[s.num_entries * width]);
    if (overlap) {
      for (int64_t j = 0; j < rate; ++j) {
        std::memcpy(&s.overlap_kv[j * width], &s.partial_kv[j * proj_width], width * sizeof(float));
        std::memcpy(&s.overlap_gate[j * width], &biased[j * proj_width], width * sizeof(float));
      }
      s.has_overlap = true;
    }
    ++s.num_entries;
    s.partial_tokens = 0;
  }
};

Compressor MainCompressor(const DeepseekV4Config& c, AttentionType type, const CompressorWeights* w, const Rope* rope) {
  const bool csa = type == AttentionType::kCompressedSparse;
  return {.w = w, .rope = rope, .width = c.head_dim, .proj_width = csa ? 2 * c.head_dim : c.head_dim,
          .rate = c.CompressRate(type), .overlap = csa, .eps = static_cast<float>(c.rms_norm_eps)};
}

Compressor IndexerCompressor(const DeepseekV4Config& c, const CompressorWeights* w, const Rope* rope) {
  return {.w = w, .rope = rope, .width = c.index_head_dim, .proj_width = 2 * c.index_head_dim,
          .rate = c.compress_rate_csa, .overlap = true, .eps = static_cast<float>(c.rms_norm_eps)};
}

CompressorState NewCompressorState(const Compressor& k) {
  CompressorState s;
  s.width = k.width;
  s.proj_width = k.proj_width;
  s.rate = k.rate;
  s.partial_kv.resize(static_cast<size_t>(k.rate * k.proj_width));
  s.partial_gate.resize(static_cast<size_t>(k.rate * k.proj_width));
  if (k.overlap) {
    s.overlap_kv.resize(static_cast<size_t>(k.rate * k.width));
    s.overlap_gate.resize(static_cast<size_t>(k.rate * k.width));
  }
  return s;
}

// The compressed entries a chunk's queries see: the full form's own, or the state's.
struct Entries {
  const float* data = nullptr;
  int64_t count = 0;
};

// Runs one compressor over the chunk's rows; returns its entries (all so far).
// With `undo`, positions from undo_from on (the chunk starts at `start`) record what they
// overwrite.
Entries Compress(const Compressor& k, const float* x, int64_t rows, int64_t hidden, CompressorState* state,
                 std::vector<float>& full_storage, bool round, cpu::ThreadPool& pool, int64_t start = 0,
                 std::vector<AppendUndo>* undo = nullptr, int64_t undo_from = 0) {
  std::vector<float> kv(static_cast<size_t>(rows * k.proj_width)), gate(kv.size());
  ProjectAll({Projection(k.w->kv_proj, x, rows, hidden, kv.data(), round),
              Projection(k.w->gate_proj, x, rows, hidden, gate.data(), round)},
             pool);
  if (state == nullptr) {
    full_storage = k.PoolAll(kv.data(), gate.data(), rows);
    return {full_storage.data(), static_cast<int64_t>(full_storage.size()) / k.width};
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool record = undo != nullptr && start + r >= undo_from;
    if (record) undo->push_back(RecordAppend(*state));
    k.Append(*state, &kv[r * k.proj_width], &gate[r * k.proj_width]);
    if (record) NoteAppended(*state, &undo->back());
  }
  return {state->entries.data(), state->num_entries};
}

}  // namespace

LayerState NewLayerState(const DeepseekV4Config& c, AttentionType type) {
  LayerState s;
  s.window.resize(static_cast<size_t>(c.sliding_window * c.head_dim));
  if (type != AttentionType::kSliding) s.compressor = NewCompressorState(MainCompressor(c, type, nullptr, nullptr));
  if (type == AttentionType::kCompressedSparse) s.indexer = NewCompressorState(IndexerCompressor(c, nullptr, nullptr));
  return s;
}

void RunAttention(const AttentionParams& p, cpu::ThreadPool& pool) {
  const DeepseekV4Config& c = *p.config;
  const AttentionWeights& w = *p.weights;
  const int64_t s = p.rows, hidden = c.hidden_size, heads = c.num_attention_heads, d = c.head_dim;
  const int64_t hd = heads * d, win = c.sliding_window, p0 = p.start_position;
  const float eps = static_cast<float>(c.rms_norm_eps);
  TANDEM_CHECK(p.state != nullptr || p0 == 0) << "the full form starts at position 0";

  // q: low-rank, weighted norm, per-head weightless norm, RoPE. K = V: one head.
  std::vector<float> cq(static_cast<size_t>(s * c.q_lora_rank)), q(static_cast<size_t>(s * hd));
  std::vector<float> kv(static_cast<size_t>(s * d));
  const bool round = p.round_fp8_input;
  ProjectAll({Projection(w.q_a_proj, p.x, s, hidden, cq.data(), round),
              Projection(w.kv_proj, p.x, s, hidden, kv.data(), round)},
             pool);
  cpu::RmsNorm(cq.data(), s, c.q_lora_rank, c.q_lora_rank, w.q_a_norm, eps, cq.data(), c.q_lora_rank);
  Project(w.q_b_proj, cq.data(), s, c.q_lora_rank, q.data(), round, pool);
  cpu::RmsNorm(kv.data(), s, d, d, w.kv_norm, eps, kv.data(), d);
  for (int64_t t = 0; t < s; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* qh = &q[t * hd + h * d];
      UnitRmsNorm(qh, d, eps);
      p.rope->Apply(qh, d, p0 + t, false);
    }
    p.rope->Apply(&kv[t * d], d, p0 + t, false);
  }

  // The keys the chunk's queries can see in the window: the state's last win - 1, then
  // the chunk's own.
  const int64_t carried = p.state != nullptr ? std::min(win - 1, p0) : 0;
  const int64_t key_first = p0 - carried;
  std::vector<float> window_keys(static_cast<size_t>((carried + s) * d));
  for (int64_t i = 0; i < carried; ++i) {
    std::memcpy(&window_keys[i * d], &p.state->window[((key_first + i) % win) * d], d * sizeof(float));
  }
  std::memcpy(&window_keys[carried * d], kv.data(), kv.size() * sizeof(float));

  // Compressed entries and, for CSA, the indexer's keys, queries and head weights.
  std::vector<float> full_entries, full_index_keys, index_q, index_w;
  Entries entries, index_keys;
  int64_t rate = 0;
  if (p.type != AttentionType::kSliding) {
    const Compressor main = MainCompressor(c, p.type, &*w.compressor, p.compress_rope);
    rate = main.rate;
    entries = Compress(main, p.x, s, hidden, p.state ? &*p.state->compressor : nullptr, full_entries, round, pool, p0,
                       p.undo ? &p.undo->compressor : nullptr, p.undo_from);
  }
  const int64_t ni = c.index_n_heads, ci = c.index_head_dim;
  if (p.type == AttentionType::kCompressedSparse) {
    const IndexerWeights& ix = *w.indexer;
    const Compressor indexer = IndexerCompressor(c, &ix.compressor, p.compress_rope);
    index_keys = Compress(indexer, p.x, s, hidden, p.state ? &*p.state->indexer : nullptr, full_index_keys, round, pool, p0,
                          p.undo ? &p.undo->indexer : nullptr, p.undo_from);
    index_q.resize(static_cast<size_t>(s * ni * ci));
    index_w.resize(static_cast<size_t>(s * ni));
    ProjectAll({Projection(ix.q_b_proj, cq.data(), s, c.q_lora_rank, index_q.data(), round),
                Projection(ix.weights_proj, p.x, s, hidden, index_w.data(), round)},
               pool);
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t h = 0; h < ni; ++h) p.compress_rope->Apply(&index_q[(t * ni + h) * ci], ci, p0 + t, false);
    }
  }

  // Each query: window keys, then the compressed entries it sees (CSA: the indexer's
  // choice among them), attended with the sinks; the rope part rotated back.
  std::vector<float> o(static_cast<size_t>(s * hd));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float index_key_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ci)));
  const float index_head_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ni)));
  pool.ParallelFor(s, 1, [&](int64_t t0, int64_t t1) {
    std::vector<const float*> keys;
    std::vector<float> scratch, scores;
    std::vector<int32_t> chosen;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = p0 + t;
      keys.clear();
      for (int64_t j = std::max<int64_t>(0, pos - win + 1); j <= pos; ++j) keys.push_back(&window_keys[(j - key_first) * d]);
      const int64_t visible = rate > 0 ? std::min((pos + 1) / rate, entries.count) : 0;
      if (p.type == AttentionType::kHeavilyCompressed) {
        for (int64_t e = 0; e < visible; ++e) keys.push_back(entries.data + e * d);
      } else if (p.type == AttentionType::kCompressedSparse && visible > 0) {
        scores.assign(static_cast<size_t>(visible), 0.0f);
        for (int64_t e = 0; e < visible; ++e) {
          float score = 0.0f;
          for (int64_t h = 0; h < ni; ++h) {
            const float dot = cpu::Dot(&index_q[(t * ni + h) * ci], index_keys.data + e * ci, ci);
            score += (std::max(dot, 0.0f) * index_key_scale) * (index_w[t * ni + h] * index_head_scale);
          }
          scores[e] = score;
        }
        TopK(scores.data(), visible, std::min(c.index_topk, visible), &chosen);
        for (int32_t e : chosen) keys.push_back(entries.data + e * d);
      }
      scratch.resize(keys.size());
      for (int64_t h = 0; h < heads; ++h) {
        float* oh = &o[t * hd + h * d];
        AttendWithSink(&q[t * hd + h * d], keys.data(), static_cast<int64_t>(keys.size()), d, scale, w.sinks[h],
                       scratch.data(), oh);
        p.rope->Apply(oh, d, pos, /*inverse=*/true);
      }
    }
  });

  // Grouped output projection: group g's heads through its own block of o_a, then o_b.
  const int64_t groups = c.o_groups, r = c.o_lora_rank, in = c.o_group_in();
  std::vector<float> grouped(static_cast<size_t>(s * groups * r));
  std::vector<cpu::MatmulParams> group_jobs;
  for (int64_t g = 0; g < groups; ++g) {
    group_jobs.push_back({.x = o.data() + g * in, .m = s, .x_stride = hd, .w = &w.o_a_groups[g],
                          .y = grouped.data() + g * r, .y_stride = groups * r, .round_fp8_input = round});
  }
  cpu::MatmulBatch(group_jobs, pool);
  Project(w.o_b_proj, grouped.data(), s, groups * r, p.out, round, pool);

  if (p.state != nullptr) {  // the ring keeps the last win positions
    if (p.undo != nullptr) {
      TANDEM_CHECK_LE(s, win) << "a chunk that may be taken back fits the window";
      for (int64_t t = std::max<int64_t>(0, p.undo_from - p0); t < s; ++t) {
        const float* row = &p.state->window[((p0 + t) % win) * d];
        p.undo->ring.insert(p.undo->ring.end(), row, row + d);
      }
    }
    for (int64_t t = std::max<int64_t>(0, s - win); t < s; ++t) {
      std::memcpy(&p.state->window[((p0 + t) % win) * d], &kv[t * d], d * sizeof(float));
    }
  }
}

}  // namespace tandem::v4
