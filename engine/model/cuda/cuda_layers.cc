// The launches of one forward step of CudaDeepseekModel: embedding, per layer attention
// and MLP/MoE, final norm, LM head, argmax. Everything here only enqueues work on the
// model's stream; host synchronization happens only where the MoE layer of a large batch
// reads its expert counts (never in a captured decode step).
#include <algorithm>
#include <cstring>

#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/invariant_gemm.h"
#include "kernels/cuda/kv_gather.h"
#include "kernels/cuda/launch_control.h"
#include "kernels/cuda/mla_decode_attention.h"
#include "kernels/cuda/mla_prefill_attention.h"
#include "kernels/cuda/mla_prepare.h"
#include "kernels/cuda/moe_expert_gemv.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/silu_mul.h"
#include "kernels/cuda/small_gemv.h"

namespace tandem {

using cuda_model::AttentionJob;
using cuda_model::CudaStatus;
using cuda_model::StepPlan;

namespace {

// DeepSeek's q_a_layernorm and kv_a_layernorm use RMSNorm's default epsilon (as the CPU
// forward does).
constexpr float kLatentNormEps = 1e-6f;
constexpr int64_t kBlock = 64;
// MoE down projections of at most this many routed rows add straight into the residual
// stream (fp32 atomics); more rows go through a buffer and a combine pass, cheaper then.
constexpr int64_t kScatterMaxRows = 512;

cuda::MoeScoring Scoring(ScoringFunc f) {
  return f == ScoringFunc::kSigmoid ? cuda::MoeScoring::kSigmoid : cuda::MoeScoring::kSoftmax;
}

cuda::MoeTopk Method(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy: return cuda::MoeTopk::kGreedy;
    case TopkMethod::kGroupLimitedGreedy: return cuda::MoeTopk::kGroupLimitedGreedy;
    case TopkMethod::kNoauxTc: return cuda::MoeTopk::kNoauxTc;
  }
  return cuda::MoeTopk::kGreedy;
}

// Row chunks of a dense GEMM spread over grid.z: only where one chunk per column tile
// would serialize many chunks (the batch-invariant mode's large steps, which never go
// to cuBLAS); each row's sums are the same either way.
int MChunks(int64_t rows, int split) {
  if (split > 1) return 1;
  return static_cast<int>(std::clamp<int64_t>(rows / 256, 1, 64));
}

}  // namespace

absl::Status CudaDeepseekModel::Impl::Dense(const DeviceMatrix& w, const __nv_bfloat16* x,
                                            const __nv_bfloat16* x_lo, int64_t ldx, int64_t rows, void* y,
                                            int64_t ldy, Out out, const cuda_model::Fp8Linear* fp8) {
  if (rows == 0) return absl::OkStatus();
  if (fp8 != nullptr && UseFp8Gemm(*fp8, rows)) return DenseFp8(*fp8, x, ldx, rows, y, ldy, out);
  const bool custom = rows <= options.small_gemm_max_rows && w.rows % 8 == 0 && w.cols % 8 == 0 && ldx % 8 == 0 &&
                      ldy % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (!custom) {
    return cuda_model::CublasStatus(
        gemm_.Linear({.x = x, .ldx = ldx, .w = w.data, .ldw = w.cols, .y = y, .ldy = ldy, .y_bf16 = out == Out::kBf16,
                      .accumulate = out == Out::kAccumulate, .m = rows, .n = w.rows, .k = w.cols},
                     stream),
        "dense GEMM (cuBLAS)");
  }
  // Split K when the output tiles alone would leave most multiprocessors idle (each split
  // keeps at least 8 K tiles).
  const int64_t tiles = (w.rows + 63) / 64, k_tiles = (w.cols + 63) / 64;
  int split = 1;
  if (out != Out::kBf16 && tiles < 2 * sm_count && !options.batch_invariant) {
    split = static_cast<int>(std::min<int64_t>({(2 * sm_count + tiles - 1) / tiles, std::max<int64_t>(k_tiles / 8, 1), 8}));
  }
  cuda::GemmEpilogue epilogue = cuda::GemmEpilogue::kAccumulateF32;
  if (out == Out::kBf16) {
    epilogue = cuda::GemmEpilogue::kStoreBf16;
  } else if (out == Out::kF32) {
    if (split == 1) {
      epilogue = cuda::GemmEpilogue::kStoreF32;
    } else {
      // A kernel rather than a memset: the GEMM can then start as its programmatic dependent.
      TANDEM_CUDA_RETURN(cuda::ZeroRows({.dst = y, .pitch_bytes = static_cast<int64_t>(ldy * sizeof(float)),
                                         .row_bytes = static_cast<int64_t>(w.rows * sizeof(float)), .rows = rows},
                                        stream),
                         "clearing a GEMM output");
    }
  }
  return CudaStatus(cuda::GroupedGemm({.a = x, .lda = ldx, .a_lo = x_lo, .b = w.data, .n = static_cast<int>(w.rows),
                                       .k = static_cast<int>(w.cols), .num_rows = static_cast<int>(rows),
                                       .rows_hint = static_cast<int>(rows), .epilogue = epilogue, .out = y, .ldo = ldy,
                                       .split_k = split, .m_chunks = MChunks(rows, split)},
                                      stream),
                    "dense GEMM");
}

bool CudaDeepseekModel::Impl::SplitQueries() const {
  return options.split_decode_queries && weights->layers[0].attention.w_uk != nullptr;
}

bool CudaDeepseekModel::Impl::Fused(const StepPlan& plan) const {
  const ModelConfig& c = config;
  return plan.decode_only && plan.jobs.size() == 1 && plan.kv_offset == 0 &&
         plan.rows <= std::min<int64_t>(options.fused_decode_max_tokens, cuda::kSmallGemvMaxRows) &&
         plan.rows <= options.moe_grouped_max_tokens && plan.rows <= options.split_activations_max_tokens &&
         c.hidden_size % 32 == 0;
}

absl::Status CudaDeepseekModel::Impl::EnqueueStep(const StepPlan& plan, const DeepseekForwardOptions& fo) {
  const ModelConfig& c = config;
  // Programmatic dependent launch for steps without host synchronization inside (the MoE
  // layers of larger steps read their expert counts); not while profiling (the events
  // between launches would serialize them anyway).
  const cuda::ScopedProgrammaticLaunch pdl(options.programmatic_launch && !profiling_ &&
                                           plan.rows <= options.moe_grouped_max_tokens);
  TANDEM_CUDA_RETURN(cuda::EmbeddingGather({.table = weights->embed.data, .tokens = plan.meta.tokens,
                                            .num_tokens = plan.rows, .dim = c.hidden_size, .out = act_.x,
                                            .out_stride = c.hidden_size},
                                           stream),
                     "embedding");
  RETURN_IF_ERROR(Mark("embedding"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(Attention(l, plan));
    if (fo.after_layer_kv) {
      if (!fo.after_layer_kv_enqueues_only) {
        TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "writing the KV cache");
      }
      fo.after_layer_kv(l);
    }
    if (weights->layers[l].moe) {
      RETURN_IF_ERROR(Moe(l, plan));
    } else {
      RETURN_IF_ERROR(Mlp(l, plan));
    }
  }
  if (plan.out_rows == 0) return absl::OkStatus();
  return EnqueueLogits(plan, 0, std::min(plan.out_rows, max_logit_rows));
}

bool CudaDeepseekModel::Impl::LogitsByGemv(int64_t count) const {
  return count <= std::min<int64_t>(options.fused_decode_max_tokens, cuda::kSmallGemvMaxRows);
}

bool CudaDeepseekModel::Impl::ArgmaxToHost(int64_t begin, int64_t count) const {
  return begin == 0 && argmax_host_dev_ != nullptr && LogitsByGemv(count);
}

absl::Status CudaDeepseekModel::Impl::EnqueueLogits(const StepPlan& plan, int64_t begin, int64_t count) {
  const ModelConfig& c = config;
  const bool split = count <= options.split_activations_max_tokens;
  if (LogitsByGemv(count)) {
    // Final norm and arg-max fused into the LM head's GEMV.
    TANDEM_CUDA_RETURN(cuda::SmallGemv({.x = act_.x, .ldx = c.hidden_size, .x_rows = plan.meta.logit_rows + begin,
                                        .norm_weight = weights->final_norm,
                                        .norm_eps = static_cast<float>(c.rms_norm_eps),
                                        .w = weights->lm_head.data, .n = static_cast<int>(c.vocab_size),
                                        .k = static_cast<int>(c.hidden_size), .rows = static_cast<int>(count),
                                        .out = act_.logits, .ldo = c.vocab_size,
                                        .argmax = ArgmaxToHost(begin, count) ? argmax_host_dev_ : act_.argmax,
                                        .argmax_scratch = act_.argmax_scratch, .argmax_counter = act_.argmax_counter},
                                       stream),
                       "LM head");
    return Mark("LM head (final norm and arg-max fused)");
  }
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = weights->final_norm, .rows = count, .dim = c.hidden_size,
                                    .x_stride = c.hidden_size, .out_stride = c.hidden_size,
                                    .eps = static_cast<float>(c.rms_norm_eps), .out_bf16 = act_.final_bf16,
                                    .row_index = plan.meta.logit_rows + begin,
                                    .out_bf16_lo = split ? act_.final_lo : nullptr},
                                   stream),
                     "final norm");
  RETURN_IF_ERROR(Mark("final norm"));
  RETURN_IF_ERROR(Dense(weights->lm_head, act_.final_bf16, split ? act_.final_lo : nullptr, c.hidden_size, count,
                        act_.logits, c.vocab_size, Out::kF32));
  RETURN_IF_ERROR(Mark("LM head"));
  TANDEM_CUDA_RETURN(cuda::Argmax({.logits = act_.logits, .stride = c.vocab_size, .rows = count, .vocab = c.vocab_size,
                                   .out = act_.argmax},
                                  stream),
                     "argmax");
  RETURN_IF_ERROR(Mark("argmax"));
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::Attention(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaAttentionWeights& w = lw.attention;
  const int64_t t = plan.rows, hidden = c.hidden_size, heads = c.num_attention_heads;
  const int64_t rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t qk = nope + rope, entry = rank + rope;
  const int64_t qkv_cols = w.qkv_a.rows;
  const bool split = t <= options.split_activations_max_tokens;
  if (Fused(plan)) return FusedAttention(layer, plan);
  const bool split_q = SplitQueries();  // LoadOptions::split_decode_queries, every absorbed job

  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = lw.input_norm, .rows = t, .dim = hidden, .x_stride = hidden,
                                    .out_stride = hidden, .eps = static_cast<float>(c.rms_norm_eps),
                                    .out_bf16 = act_.h_bf16, .out_bf16_lo = split ? act_.h_lo : nullptr},
                                   stream),
                     "input norm");
  RETURN_IF_ERROR(Mark("attention norm"));
  RETURN_IF_ERROR(
      Dense(w.qkv_a, act_.h_bf16, split ? act_.h_lo : nullptr, hidden, t, act_.qkv, qkv_cols, Out::kF32, &w.qkv_a_fp8));
  RETURN_IF_ERROR(Mark("q/kv_a projection"));
  const float* q = act_.qkv;
  int64_t q_stride = qkv_cols;
  const float* kv = act_.qkv + heads * qk;
  if (c.q_lora_rank) {
    const int64_t qr = *c.q_lora_rank;
    TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.qkv, .weight = w.q_a_norm, .rows = t, .dim = qr, .x_stride = qkv_cols,
                                      .out_stride = qr, .eps = kLatentNormEps, .out_bf16 = act_.qa_bf16,
                                      .out_bf16_lo = split ? act_.qa_lo : nullptr},
                                     stream),
                       "q_a norm");
    RETURN_IF_ERROR(Mark("q_a norm"));
    RETURN_IF_ERROR(Dense(w.q_b, act_.qa_bf16, split ? act_.qa_lo : nullptr, qr, t, act_.q_f32, heads * qk,
                          Out::kF32, &w.q_b_fp8));
    RETURN_IF_ERROR(Mark("q_b projection"));
    q = act_.q_f32;
    q_stride = heads * qk;
    kv = act_.qkv + qr;
  }
  __nv_bfloat16* kv_layer = KvLayer(layer);
  TANDEM_CUDA_RETURN(
      cuda::MlaPrepare({.num_tokens = t, .positions = plan.meta.positions, .slots = plan.meta.slots, .q = q,
                        .q_stride = q_stride, .num_heads = static_cast<int>(heads), .nope_dim = static_cast<int>(nope),
                        .rope_dim = static_cast<int>(rope), .q_out = act_.q_bf16, .q_out_stride = heads * qk,
                        .q_rope_out = act_.q_dec + rank, .q_rope_out_stride = heads * entry,
                        .q_rope_out_head_stride = entry, .q_rope_out_rows = plan.rope_out_rows, .kv = kv,
                        .kv_stride = qkv_cols, .kv_lora_rank = static_cast<int>(rank), .kv_norm_weight = w.kv_a_norm,
                        .kv_norm_eps = kLatentNormEps, .kv_cache = kv_layer, .num_slots = num_blocks * kBlock,
                        .inv_freq = inv_freq_.get<float>(), .attention_factor = rope_attention_factor_,
                        .interleaved = c.rope_interleave, .q_rope_lo_out = split_q ? act_.q_dec_lo + rank : nullptr},
                       stream),
      "MLA prepare");
  RETURN_IF_ERROR(Mark("MLA prepare"));

  for (const AttentionJob& job : plan.jobs) {
    const int64_t r0 = job.row_begin, rows = job.num_seqs * job.q_per_seq;
    if (job.absorbed) {
      // q_latent = q_nope . W_UK per head, into the decode queries' first kv_lora_rank values:
      // for split queries from the float32 queries in float32 (lat_out as scratch), then split
      // into bf16 value + remainder; else through bf16. Batch-invariant: from the float32
      // queries with k in order (kv_b's key rows read in place as [nope][rank]).
      if (options.batch_invariant) {
        TANDEM_CUDA_RETURN(cuda::InvariantGemm({.a = q + r0 * q_stride, .lda = q_stride, .a_batch = qk,
                                                .b = w.kv_b.data, .b_bf16 = true, .ldb_n = 1, .ldb_k = rank,
                                                .b_batch = (nope + v) * rank, .c = act_.q_dec + r0 * heads * entry,
                                                .c_bf16 = true, .ldc = heads * entry, .c_batch = entry,
                                                .m = static_cast<int>(rows), .n = static_cast<int>(rank),
                                                .k = static_cast<int>(nope), .batch = static_cast<int>(heads)},
                                               stream),
                           "W_UK");
      } else if (split_q) {
        TANDEM_CUBLAS_RETURN(gemm_.BatchedF32({.a = q + r0 * q_stride, .lda = q_stride, .stride_a = qk, .b = w.w_uk,
                                               .ldb = rank, .stride_b = nope * rank, .b_transposed = false,
                                               .c = act_.lat_out + r0 * heads * rank, .ldc = heads * rank,
                                               .stride_c = rank, .m = rows, .n = rank, .k = nope, .batch = heads},
                                              stream),
                             "W_UK");
        TANDEM_CUDA_RETURN(cuda::ConvertF32ToBf16({.src = act_.lat_out + r0 * heads * rank, .src_stride = rank,
                                                   .dst = act_.q_dec + r0 * heads * entry, .dst_stride = entry,
                                                   .rows = rows * heads, .cols = rank,
                                                   .dst_lo = act_.q_dec_lo + r0 * heads * entry},
                                                  stream),
                           "splitting the decode queries");
      } else {
        TANDEM_CUBLAS_RETURN(gemm_.Batched({.a = act_.q_bf16 + r0 * heads * qk, .lda = heads * qk, .stride_a = qk,
                                            .b = w.kv_b.data, .ldb = rank, .stride_b = (nope + v) * rank,
                                            .b_transposed = false, .c = act_.q_dec + r0 * heads * entry,
                                            .ldc = heads * entry, .stride_c = entry, .c_bf16 = true, .m = rows,
                                            .n = rank, .k = nope, .batch = heads},
                                           stream),
                             "W_UK");
      }
      RETURN_IF_ERROR(Mark("W_UK"));
      TANDEM_CUDA_RETURN(
          cuda::MlaDecodeAttention(
              {.q = act_.q_dec + r0 * heads * entry, .q_stride = heads * entry,
               .q_lo = split_q ? act_.q_dec_lo + r0 * heads * entry : nullptr, .kv_cache = kv_layer,
               .block_tables = plan.meta.block_tables + job.table_row * max_blocks_per_seq,
               .cache_lens = plan.meta.cache_lens + job.table_row, .kv_offset = static_cast<int>(plan.kv_offset),
               .num_seqs = static_cast<int>(job.num_seqs),
               .q_per_seq = static_cast<int>(job.q_per_seq), .num_heads = static_cast<int>(heads),
               .kv_lora_rank = static_cast<int>(rank), .rope_dim = static_cast<int>(rope), .block_size = kBlock,
               .max_blocks_per_seq = static_cast<int>(max_blocks_per_seq),
               .max_cache_len = static_cast<int>(job.max_cache_len), .softmax_scale = softmax_scale_,
               .out = act_.lat_out + r0 * heads * rank, .out_stride = heads * rank, .workspace = act_.decode_ws,
               .workspace_bytes = act_.decode_ws_bytes, .num_splits = options.batch_invariant ? 1 : 0,
               .fixed_plan = options.batch_invariant},
              stream),
          "MLA decode attention");
      RETURN_IF_ERROR(Mark("decode attention"));
      // out = latent_out . W_UV^T per head: in float32 for small steps (the latent output
      // stays unrounded), else through bf16 (tensor cores). Batch-invariant: float32, k in order.
      if (options.batch_invariant) {
        TANDEM_CUDA_RETURN(cuda::InvariantGemm({.a = act_.lat_out + r0 * heads * rank, .lda = heads * rank,
                                                .a_batch = rank, .b = w.kv_b.data + nope * rank, .b_bf16 = true,
                                                .ldb_n = rank, .ldb_k = 1, .b_batch = (nope + v) * rank,
                                                .c = act_.attn_f32 + r0 * heads * v, .ldc = heads * v, .c_batch = v,
                                                .m = static_cast<int>(rows), .n = static_cast<int>(v),
                                                .k = static_cast<int>(rank), .batch = static_cast<int>(heads)},
                                               stream),
                           "W_UV");
      } else if (split) {
        TANDEM_CUBLAS_RETURN(gemm_.BatchedF32({.a = act_.lat_out + r0 * heads * rank, .lda = heads * rank,
                                               .stride_a = rank, .b = w.w_uv, .ldb = rank, .stride_b = v * rank,
                                               .b_transposed = true, .c = act_.attn_f32 + r0 * heads * v,
                                               .ldc = heads * v, .stride_c = v, .m = rows, .n = v, .k = rank,
                                               .batch = heads},
                                              stream),
                             "W_UV");
      } else {
        TANDEM_CUDA_RETURN(cuda::ConvertF32ToBf16({.src = act_.lat_out + r0 * heads * rank, .src_stride = rank,
                                                   .dst = act_.lat_bf16 + r0 * heads * rank, .dst_stride = rank,
                                                   .rows = rows * heads, .cols = rank},
                                                  stream),
                           "attention output");
        TANDEM_CUBLAS_RETURN(gemm_.Batched({.a = act_.lat_bf16 + r0 * heads * rank, .lda = heads * rank,
                                            .stride_a = rank, .b = w.kv_b.data + nope * rank, .ldb = rank,
                                            .stride_b = (nope + v) * rank, .b_transposed = true,
                                            .c = act_.attn_f32 + r0 * heads * v, .ldc = heads * v, .stride_c = v,
                                            .m = rows, .n = v, .k = rank, .batch = heads},
                                           stream),
                             "W_UV");
      }
      RETURN_IF_ERROR(Mark("W_UV"));
    } else {
      // Expanded: the sequence's latents [0, num_kv) projected into per-head keys and values.
      const int64_t num_kv = job.max_cache_len;
      TANDEM_CUDA_RETURN(cuda::KvGather({.kv_cache = kv_layer,
                                         .block_table = plan.meta.block_tables + job.table_row * max_blocks_per_seq,
                                         .block_size = kBlock, .entry_dim = static_cast<int>(entry),
                                         .first_position = plan.kv_offset, .num_positions = num_kv,
                                         .out_bf16 = act_.kv_gathered,
                                         .out_stride = entry},
                                        stream),
                         "gathering latents");
      RETURN_IF_ERROR(Mark("latent gather"));
      RETURN_IF_ERROR(Dense(w.kv_b_split, act_.kv_gathered, nullptr, entry, num_kv, act_.kv_expanded,
                            heads * (nope + v), Out::kBf16));
      RETURN_IF_ERROR(Mark("kv_b expansion"));
      TANDEM_CUDA_RETURN(
          cuda::MlaPrefillAttention(
              {.q = act_.q_bf16 + r0 * heads * qk, .k_nope = act_.kv_expanded, .k_rope = act_.kv_gathered + rank,
               .v = act_.kv_expanded + heads * nope, .q_stride = heads * qk, .k_nope_stride = heads * (nope + v),
               .k_rope_stride = entry, .v_stride = heads * (nope + v), .num_q = static_cast<int>(rows),
               .num_kv = static_cast<int>(num_kv), .num_heads = static_cast<int>(heads),
               .nope_dim = static_cast<int>(nope), .rope_dim = static_cast<int>(rope), .v_dim = static_cast<int>(v),
               .softmax_scale = softmax_scale_, .out = act_.attn_f32 + r0 * heads * v, .out_stride = heads * v},
              stream),
          "MLA prefill attention");
      RETURN_IF_ERROR(Mark("prefill attention"));
    }
  }
  TANDEM_CUDA_RETURN(cuda::ConvertF32ToBf16({.src = act_.attn_f32, .src_stride = heads * v, .dst = act_.attn_bf16,
                                             .dst_stride = heads * v, .rows = t, .cols = heads * v,
                                             .dst_lo = split ? act_.attn_lo : nullptr},
                                            stream),
                     "attention output");
  RETURN_IF_ERROR(Mark("attention output convert"));
  RETURN_IF_ERROR(Dense(w.o_proj, act_.attn_bf16, split ? act_.attn_lo : nullptr, heads * v, t, act_.x, hidden,
                        Out::kAccumulate, &w.o_proj_fp8));
  return Mark("o_proj");
}

// A decode step of a few tokens (Fused): 4 launches (5 with q_lora) instead of 8 or more,
// float32 activations into the GEMVs, W_UK and W_UV read once in bf16.
absl::Status CudaDeepseekModel::Impl::FusedAttention(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaAttentionWeights& w = lw.attention;
  const int64_t t = plan.rows, hidden = c.hidden_size, heads = c.num_attention_heads;
  const int64_t rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t qk = nope + rope, entry = rank + rope;
  const int64_t qkv_cols = w.qkv_a.rows;
  const bool split_q = SplitQueries();
  const bool fp8 = Fp8Decode(plan);
  if (fp8 && w.qkv_a_fp8.present()) {
    RETURN_IF_ERROR(Fp8Product(w.qkv_a_fp8,
                               {.x = act_.x, .ldx = hidden, .norm_weight = lw.input_norm,
                                .norm_eps = static_cast<float>(c.rms_norm_eps)},
                               t, act_.qkv, qkv_cols, false, "q/kv_a projection (FP8)"));
  } else {
    TANDEM_CUDA_RETURN(cuda::SmallGemv({.x = act_.x, .ldx = hidden, .norm_weight = lw.input_norm,
                                        .norm_eps = static_cast<float>(c.rms_norm_eps), .w = w.qkv_a.data,
                                        .n = static_cast<int>(qkv_cols), .k = static_cast<int>(hidden),
                                        .rows = static_cast<int>(t), .out = act_.qkv, .ldo = qkv_cols},
                                       stream),
                       "q/kv_a projection");
    RETURN_IF_ERROR(Mark("q/kv_a projection (norm fused)"));
  }
  const float* q = act_.qkv;
  int64_t q_stride = qkv_cols;
  const float* kv = act_.qkv + heads * qk;
  if (c.q_lora_rank) {
    const int64_t qr = *c.q_lora_rank;
    if (fp8 && w.q_b_fp8.present()) {
      RETURN_IF_ERROR(Fp8Product(w.q_b_fp8,
                                 {.x = act_.qkv, .ldx = qkv_cols, .norm_weight = w.q_a_norm, .norm_eps = kLatentNormEps},
                                 t, act_.q_f32, heads * qk, false, "q_b projection (FP8)"));
    } else {
      TANDEM_CUDA_RETURN(cuda::SmallGemv({.x = act_.qkv, .ldx = qkv_cols, .norm_weight = w.q_a_norm,
                                          .norm_eps = kLatentNormEps, .w = w.q_b.data,
                                          .n = static_cast<int>(heads * qk), .k = static_cast<int>(qr),
                                          .rows = static_cast<int>(t), .out = act_.q_f32, .ldo = heads * qk},
                                         stream),
                         "q_b projection");
      RETURN_IF_ERROR(Mark("q_b projection (norm fused)"));
    }
    q = act_.q_f32;
    q_stride = heads * qk;
    kv = act_.qkv + qr;
  }
  __nv_bfloat16* kv_layer = KvLayer(layer);
  TANDEM_CUDA_RETURN(
      cuda::MlaPrepare({.num_tokens = t, .positions = plan.meta.positions, .slots = plan.meta.slots, .q = q,
                        .q_stride = q_stride, .num_heads = static_cast<int>(heads), .nope_dim = static_cast<int>(nope),
                        .rope_dim = static_cast<int>(rope), .q_rope_out = act_.q_dec + rank,
                        .q_rope_out_stride = heads * entry, .q_rope_out_head_stride = entry, .q_rope_out_rows = t,
                        .kv = kv, .kv_stride = qkv_cols, .kv_lora_rank = static_cast<int>(rank),
                        .kv_norm_weight = w.kv_a_norm, .kv_norm_eps = kLatentNormEps, .kv_cache = kv_layer,
                        .num_slots = num_blocks * kBlock, .inv_freq = inv_freq_.get<float>(),
                        .attention_factor = rope_attention_factor_, .interleaved = c.rope_interleave,
                        .w_uk = w.kv_b.data, .w_uk_head_stride = (nope + v) * rank, .q_latent_out = act_.q_dec,
                        .q_rope_lo_out = split_q ? act_.q_dec_lo + rank : nullptr,
                        .q_latent_lo_out = split_q ? act_.q_dec_lo : nullptr},
                       stream),
      "MLA prepare");
  RETURN_IF_ERROR(Mark("MLA prepare + W_UK"));
  const AttentionJob& job = plan.jobs.front();
  TANDEM_CUDA_RETURN(
      cuda::MlaDecodeAttention(
          {.q = act_.q_dec, .q_stride = heads * entry, .q_lo = split_q ? act_.q_dec_lo : nullptr, .kv_cache = kv_layer,
           .block_tables = plan.meta.block_tables + job.table_row * max_blocks_per_seq,
           .cache_lens = plan.meta.cache_lens + job.table_row, .num_seqs = static_cast<int>(job.num_seqs),
           .q_per_seq = static_cast<int>(job.q_per_seq), .num_heads = static_cast<int>(heads),
           .kv_lora_rank = static_cast<int>(rank), .rope_dim = static_cast<int>(rope), .block_size = kBlock,
           .max_blocks_per_seq = static_cast<int>(max_blocks_per_seq),
           .max_cache_len = static_cast<int>(job.max_cache_len), .softmax_scale = softmax_scale_, .out = act_.lat_out,
           .out_stride = heads * rank, .workspace = act_.decode_ws, .workspace_bytes = act_.decode_ws_bytes,
           .w_uv = w.kv_b.data + nope * rank, .w_uv_head_stride = (nope + v) * rank, .v_dim = static_cast<int>(v),
           .out_v = act_.attn_f32, .out_v_stride = heads * v},
          stream),
      "MLA decode attention");
  RETURN_IF_ERROR(Mark("decode attention + W_UV"));
  if (fp8 && w.o_proj_fp8.present()) {
    return Fp8Product(w.o_proj_fp8, {.x = act_.attn_f32, .ldx = heads * v}, t, act_.x, hidden, true, "o_proj (FP8)");
  }
  TANDEM_CUDA_RETURN(cuda::SmallGemv({.x = act_.attn_f32, .ldx = heads * v, .w = w.o_proj.data,
                                      .n = static_cast<int>(hidden), .k = static_cast<int>(heads * v),
                                      .rows = static_cast<int>(t), .out = act_.x, .ldo = hidden, .accumulate = true},
                                     stream),
                     "o_proj");
  return Mark("o_proj");
}

absl::Status CudaDeepseekModel::Impl::Mlp(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMlpWeights& w = *lw.mlp;
  const int64_t t = plan.rows, hidden = c.hidden_size, inter = w.down.cols;
  const bool split = t <= options.split_activations_max_tokens;
  if (Fp8Decode(plan) && w.gate_up_fp8.present() && w.down_fp8.present()) return Fp8Mlp(layer, plan);
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = lw.post_attention_norm, .rows = t, .dim = hidden,
                                    .x_stride = hidden, .out_stride = hidden, .eps = static_cast<float>(c.rms_norm_eps),
                                    .out_bf16 = act_.h_bf16, .out_bf16_lo = split ? act_.h_lo : nullptr},
                                   stream),
                     "post-attention norm");
  RETURN_IF_ERROR(Mark("MLP/MoE norm"));
  if (Fused(plan) && options.moe_expert_gemv &&
      cuda::MoeExpertGemvSupports(static_cast<int>(2 * inter), static_cast<int>(hidden), static_cast<int>(t), 1, 1) &&
      cuda::MoeExpertGemvSupports(static_cast<int>(hidden), static_cast<int>(inter), static_cast<int>(t), 1, 1)) {
    // A few tokens: the expert GEMVs with the MLP as their one static group (weights read
    // before the wait, at the memory bandwidth; the grouped GEMM's tiles are for more rows).
    const int32_t* rows = act_.dense_plan->rows;
    const cuda::MoeExpertGemvParams one_group{.group_offsets = act_.dense_plan->offsets[t],
                                              .active_groups = &act_.dense_plan->active_group,
                                              .num_active = &act_.dense_plan->num_active, .num_groups = 1,
                                              .num_static = 1, .max_active = 1, .max_rows = static_cast<int>(t)};
    cuda::MoeExpertGemvParams gate_up = one_group;
    gate_up.a = act_.h_bf16;
    gate_up.a_lo = split ? act_.h_lo : nullptr;
    gate_up.lda = hidden;
    gate_up.a_rows = rows;
    gate_up.a_row_count = static_cast<int>(t);
    gate_up.b = w.gate_up.data;
    gate_up.n = static_cast<int>(w.gate_up.rows);
    gate_up.k = static_cast<int>(hidden);
    gate_up.epilogue = cuda::GemmEpilogue::kSiluMulBf16;
    gate_up.out = act_.act_bf16;
    gate_up.ldo = inter;
    gate_up.out_lo = split ? act_.act_lo : nullptr;
    cuda::MoeExpertGemvParams down = one_group;
    down.a = act_.act_bf16;
    down.a_lo = split ? act_.act_lo : nullptr;
    down.lda = inter;
    down.staged_rows = static_cast<int>(t);
    down.b = w.down.data;
    down.n = static_cast<int>(hidden);
    down.k = static_cast<int>(inter);
    down.epilogue = cuda::GemmEpilogue::kScatterAddF32;
    down.out = act_.x;
    down.ldo = hidden;
    down.out_rows = rows;
    return ExpertProjections(gate_up, down, "MLP gate_up", "MLP down");
  }
  if (t <= options.small_gemm_max_rows) {
    TANDEM_CUDA_RETURN(cuda::GroupedGemm({.a = act_.h_bf16, .lda = hidden, .a_lo = split ? act_.h_lo : nullptr,
                                          .b = w.gate_up.data, .n = static_cast<int>(w.gate_up.rows),
                                          .k = static_cast<int>(hidden), .num_rows = static_cast<int>(t),
                                          .rows_hint = static_cast<int>(t),
                                          .epilogue = cuda::GemmEpilogue::kSiluMulBf16, .out = act_.act_bf16,
                                          .ldo = inter, .out_lo = split ? act_.act_lo : nullptr,
                                          .m_chunks = MChunks(t, 1)},
                                         stream),
                       "MLP gate_up");
    RETURN_IF_ERROR(Mark("MLP gate_up"));
  } else {
    // The FP8 form has gate rows then up rows; the bf16 copy interleaves them.
    const bool fp8 = UseFp8Gemm(w.gate_up_fp8, t);
    RETURN_IF_ERROR(Dense(w.gate_up, act_.h_bf16, nullptr, hidden, t, act_.gu, 2 * inter, Out::kF32,
                          fp8 ? &w.gate_up_fp8 : nullptr));
    RETURN_IF_ERROR(Mark("MLP gate_up"));
    TANDEM_CUDA_RETURN(cuda::SiluMul({.x = act_.gu, .x_stride = 2 * inter, .rows = t, .cols = inter,
                                      .interleave = fp8 ? 0 : cuda_model::kGateUpInterleave, .out_bf16 = act_.act_bf16,
                                      .out_stride = inter},
                                     stream),
                       "SiLU");
    RETURN_IF_ERROR(Mark("SiLU"));
  }
  const bool split_act = split && t <= options.small_gemm_max_rows;  // the SiLU epilogue wrote act_lo
  RETURN_IF_ERROR(Dense(w.down, act_.act_bf16, split_act ? act_.act_lo : nullptr, inter, t, act_.x, hidden,
                        Out::kAccumulate, &w.down_fp8));
  return Mark("MLP down");
}

absl::Status CudaDeepseekModel::Impl::Moe(int64_t layer, const StepPlan& plan) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMoeWeights& w = *lw.moe;
  const int64_t t = plan.rows, hidden = c.hidden_size, experts = c.n_routed_experts, top_k = c.num_experts_per_tok;
  const int64_t shared = c.n_shared_experts;
  int32_t* offsets = act_.group_offsets + layer * (groups_ + 1);
  const bool split = t <= options.split_activations_max_tokens;
  // The grouped kernels run one thread block per tile of an expert's rows (memory-bound at
  // decode sizes; the tiles of one expert share its weights through L2). Tiles about as
  // tall as a routed expert's mean row count: fewer re-reads of the weights.
  const bool grouped = t <= options.moe_grouped_max_tokens;
  const int64_t mean_rows = t * top_k / experts;
  const int kTileRows = mean_rows <= 16 ? 16 : mean_rows <= 32 ? 32 : 64;
  const cuda::MoeRoutingParams routing{
      .logits = act_.router_logits, .logits_stride = experts, .num_tokens = static_cast<int>(t),
      .num_experts = static_cast<int>(experts), .num_groups = static_cast<int>(c.n_group),
      .topk_groups = static_cast<int>(c.topk_group), .top_k = static_cast<int>(top_k),
      .scoring = Scoring(c.scoring_func), .method = Method(c.topk_method), .correction_bias = w.correction_bias,
      .normalize = c.norm_topk_prob, .scale_normalized = c.model_type != "deepseek_v2",
      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor), .expert_ids = act_.expert_ids,
      .weights = act_.expert_weights};
  const cuda::MoePermuteParams permute{
      .expert_ids = act_.expert_ids, .weights = act_.expert_weights, .num_tokens = static_cast<int>(t),
      .top_k = static_cast<int>(top_k), .num_experts = static_cast<int>(experts),
      .num_shared = static_cast<int>(shared),
      .group_offsets = offsets, .active_groups = act_.active_groups, .num_active = act_.num_active,
      .sorted_token = act_.sorted_token, .sorted_weight = act_.sorted_weight, .entry_row = act_.entry_row,
      .tile_rows = grouped ? kTileRows : 0, .tile_group = act_.tile_group, .tile_row = act_.tile_row,
      .num_tiles = act_.num_tiles, .scratch = act_.permute_scratch};

  if (Fused(plan) && cuda::MoeFusedRouteSupports(permute.num_tokens, permute.num_experts, permute.top_k,
                                                 permute.num_shared, permute.tile_rows)) {
    TANDEM_CUDA_RETURN(cuda::MoeFusedRoute({.x = act_.x, .x_stride = hidden, .norm_weight = lw.post_attention_norm,
                                            .norm_eps = static_cast<float>(c.rms_norm_eps),
                                            .hidden = static_cast<int>(hidden), .router = w.router,
                                            .h_bf16 = act_.h_bf16, .h_lo = split ? act_.h_lo : nullptr,
                                            .h_stride = hidden, .router_logits = act_.router_logits,
                                            .counter = act_.route_counter, .routing = routing, .permute = permute},
                                           stream),
                       "MoE routing");
    RETURN_IF_ERROR(Mark("MoE norm + router + routing + permutation"));
    return MoeExperts(layer, plan, /*after_fused_route=*/true);
  }
  RETURN_IF_ERROR(MoeFrontEnd(layer, plan, routing, permute));
  return MoeExperts(layer, plan, /*after_fused_route=*/false);
}

absl::Status CudaDeepseekModel::Impl::MoeFrontEnd(int64_t layer, const StepPlan& plan,
                                                  const cuda::MoeRoutingParams& routing,
                                                  const cuda::MoePermuteParams& permute) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMoeWeights& w = *lw.moe;
  const int64_t t = plan.rows, hidden = c.hidden_size, experts = c.n_routed_experts;
  const bool split = t <= options.split_activations_max_tokens;
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = lw.post_attention_norm, .out = act_.h_f32, .rows = t,
                                    .dim = hidden, .x_stride = hidden, .out_stride = hidden,
                                    .eps = static_cast<float>(c.rms_norm_eps), .out_bf16 = act_.h_bf16,
                                    .out_bf16_lo = split ? act_.h_lo : nullptr},
                                   stream),
                     "post-attention norm");
  RETURN_IF_ERROR(Mark("MLP/MoE norm"));
  if (options.batch_invariant) {
    TANDEM_CUDA_RETURN(cuda::InvariantGemm({.a = act_.h_f32, .lda = hidden, .b = w.router, .ldb_n = hidden,
                                            .ldb_k = 1, .c = act_.router_logits, .ldc = experts,
                                            .m = static_cast<int>(t), .n = static_cast<int>(experts),
                                            .k = static_cast<int>(hidden)},
                                           stream),
                       "router");
  } else {
    TANDEM_CUBLAS_RETURN(gemm_.LinearF32({.x = act_.h_f32, .ldx = hidden, .w = w.router, .ldw = hidden,
                                          .y = act_.router_logits, .ldy = experts, .m = t, .n = experts, .k = hidden},
                                         stream),
                         "router");
  }
  RETURN_IF_ERROR(Mark("router"));
  TANDEM_CUDA_RETURN(cuda::MoeRouting(routing, stream), "routing");
  RETURN_IF_ERROR(Mark("routing"));
  TANDEM_CUDA_RETURN(cuda::MoePermute(permute, stream), "MoE permutation");
  return Mark("MoE permute");
}

absl::Status CudaDeepseekModel::Impl::ExpertProjections(const cuda::MoeExpertGemvParams& gate_up,
                                                        const cuda::MoeExpertGemvParams& down, const char* gate_up_name,
                                                        const char* down_name) {
  TANDEM_CUDA_RETURN(cuda::MoeExpertGemv(gate_up, stream), gate_up_name);
  RETURN_IF_ERROR(Mark(gate_up_name));
  TANDEM_CUDA_RETURN(cuda::MoeExpertGemv(down, stream), down_name);
  return Mark(down_name);
}

absl::Status CudaDeepseekModel::Impl::ExpertGemmsByCublas(const std::vector<int32_t>& offsets,
                                                          const __nv_bfloat16* x, int64_t k, const __nv_bfloat16* w,
                                                          int64_t w_group_stride, float* y, int64_t n,
                                                          const char* what) {
  TANDEM_CUDA_RETURN(cudaEventRecord(side_fork_, stream), "forking the expert GEMMs");
  for (int i = 0; i < kSideStreams; ++i) {
    TANDEM_CUDA_RETURN(cudaStreamWaitEvent(side_stream_[i], side_fork_), "forking the expert GEMMs");
  }
  int next = 0;
  cublasStatus_t failed = CUBLAS_STATUS_SUCCESS;
  for (int g = 0; g + 1 < static_cast<int>(offsets.size()) && failed == CUBLAS_STATUS_SUCCESS; ++g) {
    const int64_t begin = offsets[g], count = offsets[g + 1] - offsets[g];
    if (count == 0) continue;
    const int side = next++ % kSideStreams;
    failed = side_gemm_[side].Linear({.x = x + begin * k, .ldx = k, .w = w + g * w_group_stride, .ldw = k,
                                      .y = y + begin * n, .ldy = n, .m = count, .n = n, .k = k},
                                     side_stream_[side]);
  }
  // Joined after an error too: the main stream must not run ahead of GEMMs in flight.
  for (int i = 0; i < kSideStreams; ++i) {
    TANDEM_CUDA_RETURN(cudaEventRecord(side_done_[i], side_stream_[i]), "joining the expert GEMMs");
    TANDEM_CUDA_RETURN(cudaStreamWaitEvent(stream, side_done_[i]), "joining the expert GEMMs");
  }
  TANDEM_CUBLAS_RETURN(failed, what);
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::GatherExpertRows(int64_t rows) {
  const int64_t hidden = config.hidden_size;
  TANDEM_CUDA_RETURN(cuda::GatherRows({.src = act_.h_bf16, .src_stride = hidden, .rows = act_.sorted_token,
                                       .num_rows = rows, .cols = hidden, .dst = act_.perm_bf16, .dst_stride = hidden},
                                      stream),
                     "permuting tokens");
  return Mark("MoE gather rows");
}

absl::Status CudaDeepseekModel::Impl::ExpertSiluMul(int64_t rows, int64_t inter) {
  TANDEM_CUDA_RETURN(cuda::SiluMul({.x = act_.gu, .x_stride = 2 * inter, .rows = rows, .cols = inter,
                                    .interleave = cuda_model::kGateUpInterleave, .out_bf16 = act_.act_bf16,
                                    .out_stride = inter},
                                   stream),
                     "SiLU");
  return Mark("SiLU");
}

absl::Status CudaDeepseekModel::Impl::MoeExperts(int64_t layer, const StepPlan& plan, bool after_fused_route) {
  const ModelConfig& c = config;
  const cuda_model::CudaLayerWeights& lw = weights->layers[layer];
  const cuda_model::CudaMoeWeights& w = *lw.moe;
  const int64_t t = plan.rows, hidden = c.hidden_size, experts = c.n_routed_experts, top_k = c.num_experts_per_tok;
  const int64_t shared = c.n_shared_experts, inter = w.inter, per_token = top_k + shared, rows = t * per_token;
  int32_t* offsets = act_.group_offsets + layer * (groups_ + 1);
  const bool split = t <= options.split_activations_max_tokens;
  const bool grouped = t <= options.moe_grouped_max_tokens;
  const int64_t mean_rows = t * top_k / experts;
  const int kTileRows = mean_rows <= 16 ? 16 : mean_rows <= 32 ? 32 : 64;
  // Fused decode steps (1 to 4 rows per expert): matrix-vector products, the shared
  // experts' weights read before the routing kernel has finished; gate_up stages the t
  // token rows once (a_row_count), down the rows of each expert. After the fused routing
  // kernel (which waits for o_proj before letting gate_up start), gate_up computes the
  // shared experts' tiles before its wait, from the residual it normalizes itself.
  const bool early = after_fused_route && options.moe_shared_experts_early;
  const int max_active = static_cast<int>(std::min<int64_t>(groups_, t * top_k + shared));
  if (Fused(plan) && options.moe_expert_gemv &&
      cuda::MoeExpertGemvSupports(static_cast<int>(2 * inter), static_cast<int>(hidden), static_cast<int>(t),
                                  max_active, static_cast<int>(shared)) &&
      cuda::MoeExpertGemvSupports(static_cast<int>(hidden), static_cast<int>(inter), static_cast<int>(t), max_active,
                                  static_cast<int>(shared))) {
    // An FP8 checkpoint's decode steps (fp8_decode): the experts' FP8 forms. (Elsewhere, or
    // at widths whose rows do not make whole 32-row FP8 tiles, the bf16 copies.)
    const bool fp8 = Fp8Decode(plan) && w.fp8 && hidden % 32 == 0 && (2 * inter) % 32 == 0;
    return ExpertProjections(
        {.a = act_.h_bf16, .a_lo = split ? act_.h_lo : nullptr, .lda = hidden, .a_rows = act_.sorted_token,
         .a_row_count = static_cast<int>(t), .b = fp8 ? nullptr : w.gate_up, .b_group_stride = 2 * inter * hidden,
         .b_fp8 = fp8 ? w.fp8->gate_up_interleaved : nullptr,
         .b_row_scales = fp8 ? w.fp8->gate_up_row_scales : nullptr,
         .n = static_cast<int>(2 * inter), .k = static_cast<int>(hidden), .group_offsets = offsets,
         .active_groups = act_.active_groups, .num_active = act_.num_active, .num_groups = groups_,
         .num_static = static_cast<int>(shared), .max_active = max_active, .max_rows = static_cast<int>(t),
         .epilogue = cuda::GemmEpilogue::kSiluMulBf16, .out = act_.act_bf16, .ldo = inter,
         .out_lo = split ? act_.act_lo : nullptr, .norm_x = early ? act_.x : nullptr, .norm_x_stride = hidden,
         .norm_weight = lw.post_attention_norm, .norm_eps = static_cast<float>(c.rms_norm_eps),
         .static_begin = static_cast<int>(t * top_k)},
        {.a = act_.act_bf16, .a_lo = split ? act_.act_lo : nullptr, .lda = inter,
         .staged_rows = static_cast<int>(rows), .b = fp8 ? nullptr : w.down, .b_group_stride = hidden * inter,
         .b_fp8 = fp8 ? w.fp8->down_codes : nullptr, .b_row_scales = fp8 ? w.fp8->down_row_scales : nullptr,
         .n = static_cast<int>(hidden), .k = static_cast<int>(inter), .group_offsets = offsets,
         .active_groups = act_.active_groups, .num_active = act_.num_active, .num_groups = groups_,
         .num_static = static_cast<int>(shared), .max_active = max_active, .max_rows = static_cast<int>(t),
         .epilogue = cuda::GemmEpilogue::kScatterAddF32, .out = act_.x, .ldo = hidden,
         .out_rows = act_.sorted_token, .row_scale = act_.sorted_weight,
         .partial = options.deterministic_moe_down ? act_.y : nullptr, .tile_counters = act_.down_tile_counters,
         .out_row_count = static_cast<int>(t)},
        "experts gate_up", "experts down");
  }
  if (grouped) {
    // One grouped launch per projection over every tile of every active expert.
    const int max_tiles = static_cast<int>(std::min<int64_t>(groups_, t * top_k + shared) + rows / kTileRows);
    TANDEM_CUDA_RETURN(
        cuda::GroupedGemm({.a = act_.h_bf16, .lda = hidden, .a_rows = act_.sorted_token,
                           .a_lo = split ? act_.h_lo : nullptr, .b = w.gate_up,
                           .b_group_stride = 2 * inter * hidden, .n = static_cast<int>(2 * inter),
                           .k = static_cast<int>(hidden), .group_offsets = offsets, .tile_group = act_.tile_group,
                           .tile_row = act_.tile_row, .num_tiles = act_.num_tiles, .num_groups = groups_,
                           .max_active = max_tiles, .rows_hint = kTileRows,
                           .epilogue = cuda::GemmEpilogue::kSiluMulBf16, .out = act_.act_bf16, .ldo = inter,
                           .out_lo = split ? act_.act_lo : nullptr},
                          stream),
        "experts gate_up");
    RETURN_IF_ERROR(Mark("experts gate_up"));
    // Batch-invariant: each token's experts summed by the combine in a fixed order, not by
    // atomics in completion order.
    const bool scatter = rows <= kScatterMaxRows && !options.batch_invariant;
    // A few tokens: few weight tiles per expert, so split K as well (atomics add anyway).
    const int down_split = scatter && t <= 16 ? 2 : 1;
    TANDEM_CUDA_RETURN(
        cuda::GroupedGemm({.a = act_.act_bf16, .lda = inter, .a_lo = split ? act_.act_lo : nullptr, .b = w.down,
                           .b_group_stride = hidden * inter,
                           .n = static_cast<int>(hidden), .k = static_cast<int>(inter), .group_offsets = offsets,
                           .tile_group = act_.tile_group, .tile_row = act_.tile_row, .num_tiles = act_.num_tiles,
                           .num_groups = groups_, .max_active = max_tiles, .rows_hint = kTileRows,
                           .epilogue = scatter ? cuda::GemmEpilogue::kScatterAddF32 : cuda::GemmEpilogue::kStoreF32,
                           .out = scatter ? act_.x : act_.y, .ldo = hidden,
                           .out_rows = scatter ? act_.sorted_token : nullptr,
                           .row_scale = scatter ? act_.sorted_weight : nullptr, .split_k = down_split},
                          stream),
        "experts down");
    RETURN_IF_ERROR(Mark("experts down"));
    if (scatter) return absl::OkStatus();
  } else if (options.fp8_prefill && !options.batch_invariant && act_.x_fp8 != nullptr && w.fp8) {
    RETURN_IF_ERROR(MoeExpertsFp8(layer, rows));
  } else {
    // Large batches: cuBLAS per expert over contiguous permuted rows.
    int32_t* host_offsets = small_host_.get<int32_t>();
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(host_offsets, offsets, (groups_ + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                       stream),
                       "reading expert counts");
    RETURN_IF_ERROR(GatherExpertRows(rows));
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading expert counts");
    const std::vector<int32_t> off(host_offsets, host_offsets + groups_ + 1);
    RETURN_IF_ERROR(ExpertGemmsByCublas(off, act_.perm_bf16, hidden, w.gate_up, 2 * inter * hidden, act_.gu,
                                        2 * inter, "expert gate_up"));
    RETURN_IF_ERROR(Mark("experts gate_up"));
    RETURN_IF_ERROR(ExpertSiluMul(rows, inter));
    RETURN_IF_ERROR(
        ExpertGemmsByCublas(off, act_.act_bf16, inter, w.down, hidden * inter, act_.y, hidden, "expert down"));
    RETURN_IF_ERROR(Mark("experts down"));
  }
  TANDEM_CUDA_RETURN(cuda::MoeCombine({.y = act_.y, .y_stride = hidden, .entry_row = act_.entry_row,
                                       .sorted_weight = act_.sorted_weight, .num_tokens = static_cast<int>(t),
                                       .entries_per_token = static_cast<int>(per_token), .dim = hidden, .out = act_.x,
                                       .out_stride = hidden},
                                      stream),
                     "MoE combine");
  RETURN_IF_ERROR(Mark("MoE combine"));
  return absl::OkStatus();
}

}  // namespace tandem
