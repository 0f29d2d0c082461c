// A pass's activations and the upload of its plan (CudaV4Model::Allocate, Stage).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_step.h"
#include "kernels/cuda/sink_attention.h"

namespace tandem::v4::cuda_v4 {

using cuda_model::Arena;
using step_detail::EntryBucket;
using step_detail::Rebase;
using step_detail::Staging;

absl::Status CudaV4Model::Allocate(const PassShape& shape) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  st.rows = shape.rows;
  st.max_entries_csa = EntryBucket(shape.max_entries_csa);
  const int64_t rows = shape.rows, n = c.hc_mult, d = c.hidden_size, hd = c.num_attention_heads * c.head_dim;
  int64_t x_width = 0;
  for (const CudaV4Layer& l : weights_->layers) x_width = std::max(x_width, l.x_cols.width);
  const int64_t need = c.sliding_window + std::max(std::min<int64_t>(c.index_topk, shape.max_entries_csa),
                                                  shape.max_entries_hca);
  const int64_t bucketed = c.sliding_window + std::max(std::min<int64_t>(c.index_topk, st.max_entries_csa),
                                                      EntryBucket(shape.max_entries_hca));
  st.max_keys = static_cast<int>(std::max(need, std::min<int64_t>(bucketed, cuda::kMaxSinkAttentionKeys)));
  if (st.max_keys > cuda::kMaxSinkAttentionKeys) {
    return absl::UnimplementedError(absl::StrCat("a query would attend to ", st.max_keys, " keys; the kernel takes ",
                                                 cuda::kMaxSinkAttentionKeys));
  }
  const int64_t k = c.num_experts_per_tok, inter = c.moe_intermediate_size, e = c.n_routed_experts;
  const int64_t lrows = shape.logits_rows;
  auto carve = [&](Arena& a) {
    st.streams = a.Take<float>(rows * n * d);
    st.flat = a.Take<float>(std::max(rows, lrows) * n * d);
    st.mix = a.Take<float>(std::max(rows, lrows) * (2 + n) * n);
    st.pre = a.Take<float>(std::max(rows, lrows) * n);
    st.post = a.Take<float>(rows * n);
    st.comb = a.Take<float>(rows * n * n);
    st.u = a.Take<float>(std::max(rows, lrows) * d);
    st.sub = a.Take<float>(rows * d);
    st.xp = a.Take<float>(rows * x_width);
    st.cq = a.Take<float>(rows * c.q_lora_rank);
    st.kv = a.Take<float>(rows * c.head_dim);
    st.q = a.Take<float>(rows * hd);
    st.o = a.Take<float>(rows * hd);
    st.grouped = a.Take<float>(rows * c.o_groups * c.o_lora_rank);
    st.index_q = a.Take<float>(rows * c.index_n_heads * c.index_head_dim);
    st.index_w = a.Take<float>(rows * c.index_n_heads);
    st.scores = a.Take<float>(rows * st.max_entries_csa);
    st.keys = a.Take<const float*>(rows * st.max_keys);
    st.attention_partial_floats = cuda::SinkAttentionPartialFloats(rows, static_cast<int>(c.num_attention_heads),
                                                                   static_cast<int>(c.head_dim), st.max_keys);
    st.attention_partials = a.Take<float>(st.attention_partial_floats);
    st.num_keys = a.Take<int32_t>(rows);
    st.bad = a.Take<int32_t>(2);
    st.router = a.Take<float>(rows * e);
    st.route_ids = a.Take<int32_t>(rows * k);
    st.route_w = a.Take<float>(rows * k);
    st.gathered = a.Take<float>(rows * k * d);
    st.hidden = a.Take<float>(rows * k * 2 * inter);
    st.act = a.Take<float>(rows * k * inter);
    st.expert_out = a.Take<float>(rows * k * d);
    st.shared_hidden = a.Take<float>(rows * 2 * inter);
    st.shared_act = a.Take<float>(rows * inter);
    st.logits = a.Take<float>(lrows * c.vocab_size);
  };
  Arena sizing;
  carve(sizing);
  if (sizing.used() > st.activation_bytes) {
    st.activations.Reset();
    RETURN_IF_ERROR(st.activations.Allocate(sizing.used() + sizing.used() / 2, "activations"));
    st.activation_bytes = sizing.used() + sizing.used() / 2;
  }
  Arena real(st.activations.get<char>());
  carve(real);
  if (st.host_ids.bytes() < static_cast<size_t>(rows * k) * sizeof(int32_t)) {
    RETURN_IF_ERROR(st.host_ids.Allocate(static_cast<size_t>(rows * k) * sizeof(int32_t) * 2, "routing results"));
  }
  return absl::OkStatus();
}

absl::Status CudaV4Model::Stage(const StepPlan& plan) {
  const int64_t rows = plan.rows, n = config_.hc_mult, d = config_.hidden_size;
  Step& st = *step_;
  st.plan = &plan;
  const int64_t lrows = static_cast<int64_t>(plan.logits_rows.size());

  // The plan's arrays, and the gathers of the embedding and the logits rows.
  Staging& sg = st.staging;
  st.tokens = sg.Add(plan.tokens);
  st.positions = sg.Add(plan.positions);
  st.token_seq = sg.Add(plan.token_seq);
  st.seq_start = sg.Add(plan.seq_start);
  st.seq_row0 = sg.Add(plan.seq_row0);
  st.seq_entries_csa = sg.Add(plan.seq_entries_csa);
  st.seq_entries_hca = sg.Add(plan.seq_entries_hca);
  st.seq_entry_begin_csa = sg.Add(plan.seq_entry_begin_csa);
  st.seq_entry_begin_hca = sg.Add(plan.seq_entry_begin_hca);
  st.entry_rows_csa_padded.assign(plan.entry_rows_csa.begin(), plan.entry_rows_csa.end());
  st.entry_rows_csa_padded.resize(static_cast<size_t>(EntryBucket(static_cast<int64_t>(plan.entry_rows_csa.size()))));
  st.entry_rows_hca_padded.assign(plan.entry_rows_hca.begin(), plan.entry_rows_hca.end());
  st.entry_rows_hca_padded.resize(static_cast<size_t>(EntryBucket(static_cast<int64_t>(plan.entry_rows_hca.size()))));
  st.entry_rows_csa = sg.Add(st.entry_rows_csa_padded);
  st.entry_rows_hca = sg.Add(st.entry_rows_hca_padded);
  // Kept alive until the upload: the split forms of the copies.
  std::vector<std::vector<const float*>> srcs, biases;
  std::vector<std::vector<float*>> dsts;
  srcs.reserve(8 * plan.layers.size() + 2);
  biases.reserve(srcs.capacity());
  dsts.reserve(srcs.capacity());
  auto copies = [&](const std::vector<RowCopy>& v) {
    srcs.emplace_back();
    biases.emplace_back();
    dsts.emplace_back();
    for (const RowCopy& r : v) {
      srcs.back().push_back(r.src);
      biases.back().push_back(r.bias);
      dsts.back().push_back(r.dst);
    }
    return Step::Copies{.src = sg.Add(srcs.back()), .bias = sg.Add(biases.back()), .dst = sg.Add(dsts.back()),
                        .rows = static_cast<int64_t>(v.size())};
  };
  auto compressor = [&](const CompressorJob& j) {
    return Step::Compressor{.slots = sg.Add(j.slots), .num_slots = sg.Add(j.num_slots),
                            .positions = sg.Add(j.positions), .out = sg.Add(j.out)};
  };
  st.layers.assign(plan.layers.size(), {});
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const LayerPlan& lp = plan.layers[l];
    Step::Layer& sl = st.layers[l];
    sl.main = compressor(lp.main);
    sl.indexer = compressor(lp.indexer);
    sl.main_overlap = copies(lp.main.overlap_copies);
    sl.main_partial = copies(lp.main.partial_copies);
    sl.indexer_overlap = copies(lp.indexer.overlap_copies);
    sl.indexer_partial = copies(lp.indexer.partial_copies);
    sl.ring = copies(lp.ring_copies);
    sl.seq_ring = sg.Add(lp.seq_ring);
  }
  {  // every stream starts as the token's embedding
    std::vector<RowCopy> embed;
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t s = 0; s < n; ++s) {
        embed.push_back({weights_->embed.data + static_cast<int64_t>(plan.tokens[t]) * d, nullptr,
                         st.streams + (t * n + s) * d});
      }
    }
    const Step::Copies e = copies(embed);
    st.embed_src = e.src;
    st.embed_dst = e.dst;
    std::vector<RowCopy> gather;
    for (size_t r = 0; r < plan.logits_rows.size(); ++r) {
      gather.push_back({st.streams + plan.logits_rows[r] * n * d, nullptr, st.flat + static_cast<int64_t>(r) * n * d});
    }
    const Step::Copies g = copies(gather);
    st.logits_src = g.src;
    st.logits_dst = g.dst;
    st.logits_rows = lrows;
  }
  st.routed_rows_host.resize(static_cast<size_t>(rows * config_.num_experts_per_tok));
  for (size_t i = 0; i < st.routed_rows_host.size(); ++i) {
    st.routed_rows_host[i] = st.expert_out + static_cast<int64_t>(i) * d;
  }
  st.routed_rows = sg.Add(st.routed_rows_host);
  ASSIGN_OR_RETURN(const std::byte* base, sg.Upload(stream_));
  st.staged_base = base;
  // Rebase every staged pointer.
  st.routed_rows = Rebase(st.routed_rows, base);
  st.tokens = Rebase(st.tokens, base);
  st.positions = Rebase(st.positions, base);
  st.token_seq = Rebase(st.token_seq, base);
  st.seq_start = Rebase(st.seq_start, base);
  st.seq_row0 = Rebase(st.seq_row0, base);
  st.seq_entries_csa = Rebase(st.seq_entries_csa, base);
  st.seq_entries_hca = Rebase(st.seq_entries_hca, base);
  st.seq_entry_begin_csa = Rebase(st.seq_entry_begin_csa, base);
  st.seq_entry_begin_hca = Rebase(st.seq_entry_begin_hca, base);
  st.entry_rows_csa = Rebase(st.entry_rows_csa, base);
  st.entry_rows_hca = Rebase(st.entry_rows_hca, base);
  auto rebase_copies = [&](Step::Copies& cp) {
    cp.src = Rebase(cp.src, base);
    cp.bias = Rebase(cp.bias, base);
    cp.dst = Rebase(cp.dst, base);
  };
  auto rebase_compressor = [&](Step::Compressor& cp) {
    cp.slots = Rebase(cp.slots, base);
    cp.num_slots = Rebase(cp.num_slots, base);
    cp.positions = Rebase(cp.positions, base);
    cp.out = Rebase(cp.out, base);
  };
  for (Step::Layer& sl : st.layers) {
    rebase_compressor(sl.main);
    rebase_compressor(sl.indexer);
    for (Step::Copies* cp : {&sl.main_overlap, &sl.main_partial, &sl.indexer_overlap, &sl.indexer_partial, &sl.ring}) {
      rebase_copies(*cp);
    }
    sl.seq_ring = Rebase(sl.seq_ring, base);
  }
  st.embed_src = Rebase(st.embed_src, base);
  st.embed_dst = Rebase(st.embed_dst, base);
  st.logits_src = Rebase(st.logits_src, base);
  st.logits_dst = Rebase(st.logits_dst, base);
  TANDEM_CUDA_RETURN(cudaMemsetAsync(st.bad, 0, 2 * sizeof(int32_t), stream_), "clearing error flags");
  return absl::OkStatus();
}

}  // namespace tandem::v4::cuda_v4
