#include "engine/model/deepseek_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/tensor_parallel.h"
#include "engine/util/status_macros.h"
#include "kernels/cpu/fp8_gemm_input.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/common/check.h"

namespace tandem {
namespace {

// DeepSeek's q_a_layernorm and kv_a_layernorm use the RMSNorm default epsilon, not the
// config's rms_norm_eps (as the reference implementations construct them).
constexpr float kLatentNormEps = 1e-6f;

void Linear(const float* x, int64_t rows, int64_t x_stride, const WeightMatrix& w, float* y,
            cpu::ThreadPool& pool, bool accumulate = false, int64_t y_stride = 0) {
  if (w.rows == 0) return;  // a rank's empty part of a split matrix
  cpu::Matmul({.x = x, .m = rows, .x_stride = x_stride, .w = &w, .y = y, .y_stride = y_stride ? y_stride : w.rows,
               .accumulate = accumulate},
              pool);
}

cpu::MoeScoring Scoring(ScoringFunc f) {
  return f == ScoringFunc::kSigmoid ? cpu::MoeScoring::kSigmoid : cpu::MoeScoring::kSoftmax;
}

cpu::MoeTopk Method(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy: return cpu::MoeTopk::kGreedy;
    case TopkMethod::kGroupLimitedGreedy: return cpu::MoeTopk::kGroupLimitedGreedy;
    case TopkMethod::kNoauxTc: return cpu::MoeTopk::kNoauxTc;
  }
  return cpu::MoeTopk::kGreedy;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeepseekModel>> DeepseekModel::Load(const std::string& dir,
                                                                   const LoadOptions& options) {
  auto model = std::unique_ptr<DeepseekModel>(new DeepseekModel());
  ASSIGN_OR_RETURN(model->config_, LoadModelConfig(dir));
  if (options.group != nullptr) {
    if (options.mtp) {
      return absl::FailedPreconditionError("speculative decoding (the MTP layer) does not run split over ranks yet");
    }
    if (options.data_parallel && options.tensor_parallel && options.group->world_size() > 1) {
      return absl::UnimplementedError(
          "tensor parallelism under data-parallel attention is not implemented: the split LM head and dense "
          "MLPs need every rank's rows (docs/parallel.md)");
    }
    model->group_ = options.group;
    model->layout_ = {.rank = options.group->rank(), .world = options.group->world_size(),
                      .expert_parallel = options.expert_parallel, .tensor_parallel = options.tensor_parallel,
                      .data_parallel = options.data_parallel};
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  ASSIGN_OR_RETURN(model->loaded_, LoadedWeights::Load(model->config_, std::move(ckpt), model->layout_));
  if (model->layout_.experts_split()) {
    model->expert_parallel_ =
        std::make_unique<ExpertParallelMoe>(*model->group_, model->layout_, model->config_.n_routed_experts);
  }
  model->pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  model->inv_freq_ = model->config_.RopeInverseFrequencies();
  model->rope_attention_factor_ = static_cast<float>(model->config_.RopeAttentionFactor());
  model->softmax_scale_ = static_cast<float>(model->config_.SoftmaxScale());
  model->bf16_kv_cache_ = options.bf16_kv_cache;
  model->fp8_activation_rounding_ = options.fp8_activation_rounding;
  if (options.mtp) {
    const ModelWeights& w = model->weights();
    if (w.mtp_layers.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "speculative decoding needs the checkpoint's MTP layer, and '", dir, "' has none (num_nextn_predict_layers ",
          model->config_.num_nextn_predict_layers, ", no model.layers.", model->config_.num_hidden_layers,
          ".eh_proj.weight)"));
    }
    model->mtp_ = &w.mtp_layers.front();
  }
  return model;
}

absl::Status DeepseekModel::CheckBatch(std::span<const ForwardSequence> batch, const LatentKvCache& cache) const {
  FlatBatch flat;
  return Flatten(batch, cache, &flat);
}

absl::Status DeepseekModel::Flatten(std::span<const ForwardSequence> batch, const LatentKvCache& cache,
                                    FlatBatch* flat) const {
  const ModelConfig& c = config_;
  if (mtp_ != nullptr && cache.num_layers() != c.num_hidden_layers + 1) {
    return absl::InvalidArgumentError(absl::StrCat("a model with its MTP layer needs a KV cache of ",
                                                   c.num_hidden_layers + 1, " layers, not ", cache.num_layers()));
  }
  flat->seqs.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has no new tokens"));
    if ((s.mtp || s.keep_hidden) && mtp_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", i, " asks for the MTP layer, which this model was loaded without"));
    }
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    // The MTP pass writes slot `end` when it knows the token there.
    const int64_t written = end + (s.mtp && s.mtp_next_token >= 0 ? 1 : 0);
    if (s.start_position < 0 || written > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " reaches position ", written,
                                                     ", beyond max_position_embeddings ",
                                                     c.max_position_embeddings));
    }
    if (static_cast<int64_t>(s.block_table.size()) * cache.block_size() < written) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", s.block_table.size(),
                                                     " cache blocks cannot hold ", written, " tokens"));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= cache.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": block id ", b, " out of range"));
      }
    }
    if (s.mtp && s.mtp_next_token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", s.mtp_next_token,
                                                     " is outside the vocabulary (size ", c.vocab_size, ")"));
    }
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const int32_t t = s.tokens[j];
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary (size ",
                                                       c.vocab_size, ")"));
      }
      if (!s.no_logits && (s.all_logits || j + 1 == s.tokens.size())) {
        flat->logit_rows.push_back(static_cast<int64_t>(flat->tokens.size()));
      }
      flat->tokens.push_back(t);
    }
    flat->seqs.push_back({.first_position = s.start_position,
                          .num_tokens = static_cast<int64_t>(s.tokens.size()),
                          .block_table = s.block_table,
                          .skip_first_write = s.first_kv_cached});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DeepseekModel::Forward(std::span<const ForwardSequence> batch,
                                                          LatentKvCache& cache, const DeepseekForwardOptions& options) {
  const ModelConfig& c = config_;
  const ModelWeights& w = weights();
  const int64_t hidden = c.hidden_size;
  FlatBatch flat;
  RETURN_IF_ERROR(Flatten(batch, cache, &flat));
  const std::vector<int32_t>& tokens = flat.tokens;
  const std::vector<int64_t>& logit_rows = flat.logit_rows;
  const std::vector<AttentionRows>& seqs = flat.seqs;
  const int64_t rows = static_cast<int64_t>(tokens.size());

  std::vector<float> x(static_cast<size_t>(rows * hidden));
  for (int64_t r = 0; r < rows; ++r) cpu::DequantizeRows(w.embed, tokens[r], 1, &x[r * hidden]);
  parallel_status_ = absl::OkStatus();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    DecoderLayer(w.layers[l], l, l, /*slot_offset=*/0, seqs, x.data(), rows, cache, options);
  }
  RETURN_IF_ERROR(parallel_status_);

  if (mtp_ != nullptr) {
    kept_hidden_.clear();
    int64_t r = 0;
    for (const ForwardSequence& s : batch) {
      const int64_t n = static_cast<int64_t>(s.tokens.size());
      if (s.keep_hidden) kept_hidden_.insert(kept_hidden_.end(), &x[r * hidden], &x[(r + n) * hidden]);
      r += n;
    }
    FillMtpSlots(batch, x.data(), cache, options);
  }

  const int64_t out_rows = static_cast<int64_t>(logit_rows.size());
  if (out_rows == 0) return std::vector<float>();
  std::vector<float> last(static_cast<size_t>(out_rows * hidden));
  for (int64_t i = 0; i < out_rows; ++i) {
    cpu::RmsNorm(&x[logit_rows[i] * hidden], 1, hidden, hidden, w.final_norm, static_cast<float>(c.rms_norm_eps),
                 &last[i * hidden], hidden);
  }
  std::vector<float> logits = LmHead(last.data(), out_rows);
  RETURN_IF_ERROR(parallel_status_);
  return logits;
}

std::vector<float> DeepseekModel::LmHead(const float* last, int64_t rows) {
  const ModelWeights& w = weights();
  const int64_t vocab = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  const RowSplit& split = w.lm_head_split;
  if (split.world == 1) {
    Linear(last, rows, config_.hidden_size, w.lm_head, logits.data(), *pool_);
    return logits;
  }
  std::vector<float> local(static_cast<size_t>(rows * split.chunk));
  Linear(last, rows, config_.hidden_size, w.lm_head, local.data(), *pool_, false, split.chunk);
  if (parallel_status_.ok()) {
    parallel_status_ = GatherColumns(*group_, split, local.data(), rows, logits.data(), vocab, gather_scratch_);
  }
  return logits;
}

void DeepseekModel::DecoderLayer(const DecoderLayerWeights& layer, int64_t layer_index, int64_t cache_layer,
                                 int64_t slot_offset, std::span<const AttentionRows> seqs, float* x, int64_t rows,
                                 LatentKvCache& cache, const DeepseekForwardOptions& options) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const size_t n = static_cast<size_t>(rows * hidden);
  std::vector<float> h(n), delta(n);
  cpu::RmsNorm(x, rows, hidden, hidden, layer.input_norm, static_cast<float>(c.rms_norm_eps), h.data(), hidden);
  Attention(layer.attention, cache_layer, slot_offset, seqs, h.data(), delta.data(), cache, options.attention);
  if (options.after_layer_kv) options.after_layer_kv(cache_layer);
  for (size_t i = 0; i < n; ++i) x[i] += delta[i];

  cpu::RmsNorm(x, rows, hidden, hidden, layer.post_attention_norm, static_cast<float>(c.rms_norm_eps), h.data(),
               hidden);
  if (layer.moe) {
    Moe(*layer.moe, layer_index, h.data(), rows, delta.data(), options);
  } else {
    DenseMlp(*layer.mlp, h.data(), rows, delta.data(), /*accumulate=*/false);
  }
  for (size_t i = 0; i < n; ++i) x[i] += delta[i];
}

const float* DeepseekModel::Fp8Input(const float* x, int64_t rows, int64_t stride, const cpu::WeightMatrix& w,
                                     std::vector<float>& buf, int64_t* used_stride) const {
  *used_stride = stride;
  if (!fp8_activation_rounding_ || w.dtype != DType::kF8E4M3 || rows == 0) return x;
  buf.resize(static_cast<size_t>(rows * w.cols));
  cpu::RoundAsFp8GemmInput(x, rows, stride, w.cols, /*bf16_first=*/true, buf.data());
  *used_stride = w.cols;
  return buf.data();
}

void DeepseekModel::Attention(const AttentionWeights& w, int64_t cache_layer, int64_t slot_offset,
                              std::span<const AttentionRows> seqs, const float* h, float* out,
                              LatentKvCache& cache, AttentionForm form) {
  const ModelConfig& c = config_;
  int64_t rows = 0;
  for (const AttentionRows& s : seqs) rows += s.num_tokens;
  const int64_t heads = c.num_attention_heads;
  const int64_t qk = c.qk_head_dim();
  const int64_t lora = c.kv_lora_rank;
  const int64_t half_rope = c.qk_rope_head_dim / 2;

  // Queries: [rows][heads][nope | rope]; the latent KV of the new tokens. The
  // projections of h go in one fork-join (cpu::MatmulBatch: the same bits).
  std::vector<float> q(static_cast<size_t>(rows * heads * qk));
  const int64_t entry = c.kv_entry_dim();
  std::vector<float> kv(static_cast<size_t>(rows * entry));
  std::vector<float> rounded;  // fp8_activation_rounding: h as the FP8 products read it
  int64_t h_stride = 0;
  h = Fp8Input(h, rows, c.hidden_size, w.kv_a_proj, rounded, &h_stride);
  const cpu::MatmulParams kv_job{.x = h, .m = rows, .x_stride = h_stride, .w = &w.kv_a_proj, .y = kv.data(),
                                 .y_stride = w.kv_a_proj.rows};
  if (c.q_lora_rank) {
    const int64_t qr = *c.q_lora_rank;
    std::vector<float> qa(static_cast<size_t>(rows * qr));
    const cpu::MatmulParams jobs[] = {
        {.x = h, .m = rows, .x_stride = h_stride, .w = &w.q_a_proj, .y = qa.data(), .y_stride = w.q_a_proj.rows},
        kv_job};
    cpu::MatmulBatch(jobs, *pool_);
    cpu::RmsNorm(qa.data(), rows, qr, qr, w.q_a_norm, kLatentNormEps, qa.data(), qr);
    std::vector<float> qa_rounded;
    int64_t qa_stride = 0;
    const float* qa_in = Fp8Input(qa.data(), rows, qr, w.q_b_proj, qa_rounded, &qa_stride);
    Linear(qa_in, rows, qa_stride, w.q_b_proj, q.data(), *pool_);
  } else {
    const cpu::MatmulParams jobs[] = {
        {.x = h, .m = rows, .x_stride = h_stride, .w = &w.q_proj, .y = q.data(), .y_stride = w.q_proj.rows},
        kv_job};
    cpu::MatmulBatch(jobs, *pool_);
  }

  // The latent KV: normalized latent + rotated rotary key, into the cache (except a first
  // row whose KV is cached already: it computes the same entry).
  std::vector<float> cos(static_cast<size_t>(half_rope)), sin(static_cast<size_t>(half_rope));
  int64_t r = 0;
  for (const AttentionRows& s : seqs) {
    for (int64_t j = 0; j < s.num_tokens; ++j, ++r) {
      const int64_t position = s.first_position + j;
      cpu::RopeCosSin(position, inv_freq_.data(), half_rope, rope_attention_factor_, cos.data(), sin.data());
      float* kv_row = &kv[r * entry];
      cpu::RmsNorm(kv_row, 1, lora, lora, w.kv_a_norm, kLatentNormEps, kv_row, lora);
      cpu::ApplyRope(kv_row + lora, cos.data(), sin.data(), half_rope, c.rope_interleave);
      for (int64_t hd = 0; hd < heads; ++hd) {
        cpu::ApplyRope(&q[(r * heads + hd) * qk + c.qk_nope_head_dim], cos.data(), sin.data(), half_rope,
                       c.rope_interleave);
      }
      if (bf16_kv_cache_) {
        for (int64_t i = 0; i < entry; ++i) kv_row[i] = Bf16ToF32(F32ToBf16(kv_row[i]));
      }
      if (j == 0 && s.skip_first_write) continue;
      std::copy(kv_row, kv_row + entry, cache.Entry(cache_layer, s.block_table, position + slot_offset));
    }
  }

  // Attention per sequence, over its whole cached history.
  std::vector<float> attn(static_cast<size_t>(rows * heads * c.v_head_dim));
  r = 0;
  for (const AttentionRows& s : seqs) {
    const int64_t n = s.num_tokens;
    cpu::MlaAttentionParams p{.num_heads = heads, .qk_nope_dim = c.qk_nope_head_dim,
                              .qk_rope_dim = c.qk_rope_head_dim, .v_dim = c.v_head_dim,
                              .kv_lora_rank = lora, .softmax_scale = softmax_scale_,
                              .q = &q[r * heads * qk], .q_stride = heads * qk, .num_tokens = n,
                              .first_position = s.first_position,
                              .cache = cache.View(cache_layer, s.block_table, slot_offset),
                              .kv_b = &w.kv_b_proj, .out = &attn[r * heads * c.v_head_dim],
                              .out_stride = heads * c.v_head_dim};
    // kAuto is the absorbed form for every position, prefill chunks included: a position
    // recomputed by a re-prefill (migration, preemption, a prefix from another request)
    // must get the bits its decode step got (AttentionForm).
    if (form == AttentionForm::kExpanded) cpu::MlaAttentionExpanded(p, *pool_);
    else cpu::MlaAttentionAbsorbed(p, *pool_);
    r += n;
  }
  std::vector<float> attn_rounded;
  int64_t attn_stride = 0;
  const float* attn_in = Fp8Input(attn.data(), rows, heads * c.v_head_dim, w.o_proj, attn_rounded, &attn_stride);
  Linear(attn_in, rows, attn_stride, w.o_proj, out, *pool_);
}

void DeepseekModel::DenseMlp(const MlpWeights& w, const float* h, int64_t rows, float* out, bool accumulate) {
  if (w.inter_split.world > 1) {
    TANDEM_CHECK(!accumulate) << "only dense layers' MLPs are split";
    TensorParallelMlp(w, h, rows, out);
    return;
  }
  MlpRun run{.w = &w, .x = h, .rows = rows, .y = out, .accumulate = accumulate};
  RunMlps({&run, 1});
}

// Two fork-joins for any number of SwiGLU MLPs: every gate and up projection, then every
// down projection (cpu::MatmulBatch: the bits of one matmul at a time).
void DeepseekModel::RunMlps(std::span<MlpRun> runs) {
  const int64_t hidden = config_.hidden_size;
  std::vector<cpu::MatmulParams> jobs;
  // fp8_activation_rounding: each run's inputs as its FP8 products read them.
  std::vector<std::vector<float>> rounded(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    MlpRun& r = runs[i];
    const int64_t inter = r.w->gate.rows;
    r.gate.resize(static_cast<size_t>(r.rows * inter));
    r.up.resize(r.gate.size());
    int64_t stride = 0;
    const float* x = Fp8Input(r.x, r.rows, hidden, r.w->gate, rounded[i], &stride);
    jobs.push_back({.x = x, .m = r.rows, .x_stride = stride, .w = &r.w->gate, .y = r.gate.data(), .y_stride = inter});
    jobs.push_back({.x = x, .m = r.rows, .x_stride = stride, .w = &r.w->up, .y = r.up.data(), .y_stride = inter});
  }
  cpu::MatmulBatch(jobs, *pool_);
  jobs.clear();
  for (size_t i = 0; i < runs.size(); ++i) {
    MlpRun& r = runs[i];
    const int64_t inter = r.w->gate.rows;
    cpu::SiluMul(r.gate.data(), r.up.data(), r.gate.data(), r.rows * inter);
    int64_t stride = 0;
    const float* act = Fp8Input(r.gate.data(), r.rows, inter, r.w->down, rounded[i], &stride);
    jobs.push_back({.x = act, .m = r.rows, .x_stride = stride, .w = &r.w->down, .y = r.y,
                    .y_stride = r.w->down.rows, .accumulate = r.accumulate});
  }
  cpu::MatmulBatch(jobs, *pool_);
}

void DeepseekModel::Moe(const MoeWeights& w, int64_t layer, const float* h, int64_t rows, float* out,
                       const DeepseekForwardOptions& options) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t experts = c.n_routed_experts;
  const int64_t top_k = c.num_experts_per_tok;

  std::vector<float> logits(static_cast<size_t>(rows * experts));
  Linear(h, rows, hidden, w.router, logits.data(), *pool_);
  std::vector<int32_t> ids(static_cast<size_t>(rows * top_k));
  std::vector<float> weights(static_cast<size_t>(rows * top_k));
  const cpu::MoeRoutingParams routing{
      .logits = logits.data(), .num_tokens = rows, .num_experts = experts, .num_groups = c.n_group,
      .topk_groups = c.topk_group, .top_k = top_k, .scoring = Scoring(c.scoring_func),
      .method = Method(c.topk_method), .correction_bias = w.correction_bias, .normalize = c.norm_topk_prob,
      .scale_normalized = c.model_type != "deepseek_v2",
      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor), .expert_ids = ids.data(),
      .weights = weights.data()};
  cpu::RouteMoe(routing);
  if (options.after_routing) options.after_routing(layer, routing);

  if (expert_parallel_ != nullptr) {
    ExpertParallelRoutedExperts(w, h, rows, ids.data(), weights.data(), out);
    if (w.shared) DenseMlp(*w.shared, h, rows, out, /*accumulate=*/true);
    return;
  }

  // Group tokens by expert; run each chosen expert once over its tokens.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(experts));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < top_k; ++k) assigned[ids[r * top_k + k]].emplace_back(r, weights[r * top_k + k]);
  }
  // Every chosen expert and the shared experts in one RunMlps. The shared experts' sum
  // goes to its own buffer and is added after the routed ones, as the accumulating
  // matmul added it before (the same single addition per element).
  std::fill(out, out + rows * hidden, 0.0f);
  std::vector<std::vector<float>> xs(static_cast<size_t>(experts)), ys(static_cast<size_t>(experts));
  std::vector<MlpRun> runs;
  for (int64_t e = 0; e < experts; ++e) {
    const auto& tok = assigned[e];
    if (tok.empty()) continue;
    const int64_t n = static_cast<int64_t>(tok.size());
    xs[e].resize(static_cast<size_t>(n * hidden));
    ys[e].resize(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i) std::copy(h + tok[i].first * hidden, h + (tok[i].first + 1) * hidden, &xs[e][i * hidden]);
    runs.push_back({.w = &w.experts[e], .x = xs[e].data(), .rows = n, .y = ys[e].data()});
  }
  std::vector<float> shared;
  if (w.shared) {
    shared.resize(static_cast<size_t>(rows * hidden));
    runs.push_back({.w = &*w.shared, .x = h, .rows = rows, .y = shared.data()});
  }
  RunMlps(runs);
  for (int64_t e = 0; e < experts; ++e) {
    const auto& tok = assigned[e];
    for (size_t i = 0; i < tok.size(); ++i) {
      AddWeightedExpertOutput(out + tok[i].first * hidden, &ys[e][i * hidden], tok[i].second, hidden);
    }
  }
  for (size_t i = 0; i < shared.size(); ++i) out[i] += shared[i];
}

void DeepseekModel::ExpertParallelRoutedExperts(const MoeWeights& w, const float* h, int64_t rows, const int32_t* ids,
                                                const float* weights, float* out) {
  if (!parallel_status_.ok()) return;
  const int64_t hidden = config_.hidden_size;
  const int64_t top_k = config_.num_experts_per_tok;
  const ExpertFn run_expert = [&](int64_t e, const float* x, int64_t n, float* y) {
    DenseMlp(w.experts[e], x, n, y, false);
  };
  if (layout_.data_parallel) {
    // The rows are this rank's sequences' and no other rank has them: all of them go
    // through the exchange, and their outputs are this rank's result (each expert output
    // is one row's dot products, whatever rows an expert runs with it).
    const RoutedRows in{.x = h, .rows = rows, .hidden = hidden, .top_k = top_k, .expert_ids = ids,
                        .weights = weights};
    parallel_status_ = expert_parallel_->Run(in, run_expert, out);
    return;
  }
  // Every rank has the whole batch: each dispatches its block of rows (so every expert
  // runs each row once, in batch order), and the blocks' outputs are gathered.
  const int64_t begin = RowBlockBegin(rows, layout_.world, layout_.rank);
  const int64_t mine = RowBlockBegin(rows, layout_.world, layout_.rank + 1) - begin;
  std::vector<float> local(static_cast<size_t>(mine * hidden));
  const RoutedRows in{.x = h + begin * hidden, .rows = mine, .hidden = hidden, .top_k = top_k,
                      .expert_ids = ids + begin * top_k, .weights = weights + begin * top_k};
  parallel_status_ = expert_parallel_->Run(in, run_expert, local.data());
  if (!parallel_status_.ok()) return;
  parallel_status_ = GatherRowBlocks(*group_, local.data(), rows, hidden, out, gather_scratch_);
}

void DeepseekModel::TensorParallelMlp(const MlpWeights& w, const float* h, int64_t rows, float* out) {
  if (!parallel_status_.ok()) return;
  const int64_t hidden = config_.hidden_size;
  const RowSplit& is = w.inter_split;
  const RowSplit& hs = w.hidden_split;
  // The rank's intermediate features (padded to the split's chunk), then all of them.
  std::vector<float> gate(static_cast<size_t>(rows * is.chunk)), up(gate.size());
  Linear(h, rows, hidden, w.gate, gate.data(), *pool_, false, is.chunk);
  Linear(h, rows, hidden, w.up, up.data(), *pool_, false, is.chunk);
  cpu::SiluMul(gate.data(), up.data(), gate.data(), rows * is.chunk);
  std::vector<float> act(static_cast<size_t>(rows * is.rows));
  parallel_status_ = GatherColumns(*group_, is, gate.data(), rows, act.data(), is.rows, gather_scratch_);
  if (!parallel_status_.ok()) return;
  // The rank's output features over every intermediate feature: each output a whole dot
  // product, as on one rank (a split of the intermediate features with an all-reduce of
  // partial sums would round differently).
  std::vector<float> y(static_cast<size_t>(rows * hs.chunk));
  Linear(act.data(), rows, is.rows, w.down, y.data(), *pool_, false, hs.chunk);
  parallel_status_ = GatherColumns(*group_, hs, y.data(), rows, out, hidden, gather_scratch_);
}

}  // namespace tandem
