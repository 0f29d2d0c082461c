// DeepSeek-V3's multi-token-prediction layer on the GPU (docs/speculative-decoding.md): the
// MTP slots a forward pass fills, the hidden states it keeps, and the draft pass. The
// layer's decoder block runs through the same launchers as the decoder layers (Attention,
// Moe, Mlp) over a plan whose positions are the slots' minus one, its KV one layer after
// theirs, every attention job absorbed (the decode kernel reads slot p + 1 for position p)
// or, for long rows, expanded over latents gathered from slot 1 on.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/draft_choice.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/token_mask.h"

namespace tandem {

using cuda_model::AttentionJob;
using cuda_model::StepMeta;
using cuda_model::StepPlan;

namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kAbsorbedChunk = 64;

}  // namespace

absl::Status CudaDeepseekModel::Impl::MtpAfterForward(std::span<const ForwardSequence> batch, const StepPlan& plan,
                                                      const DeepseekForwardOptions& fo) {
  const int64_t hidden = config.hidden_size;
  RETURN_IF_ERROR(AllocateMtpBuffers());
  // The kept hidden states, in batch order.
  kept_rows_ = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].keep_hidden) continue;
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(kept_hidden_.get<float>() + kept_rows_ * hidden,
                                       act_.x + plan.seq_rows[i] * hidden, n * hidden * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream),
                       "keeping hidden states");
    kept_rows_ += n;
  }
  // Slot start + 1 + j from row j's hidden state and the token after it.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<MtpRows> seqs;
  int64_t in_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    if (!s.mtp) continue;
    std::vector<int32_t> t(s.tokens.begin() + 1, s.tokens.end());
    if (s.mtp_next_token >= 0) t.push_back(s.mtp_next_token);
    if (t.empty()) continue;
    const int64_t count = static_cast<int64_t>(t.size());
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(mtp_in_.get<float>() + in_row * hidden, act_.x + plan.seq_rows[i] * hidden,
                                       count * hidden * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                       "gathering the MTP layer's inputs");
    tokens.push_back(std::move(t));
    seqs.push_back({.first_slot = s.start_position + 1, .count = count,
                    .tokens = tokens.back(), .block_table = s.block_table});
    in_row += count;
  }
  if (seqs.empty()) {
    // Nothing to fill, but a caller streaming every layer's KV still hears of this one.
    if (fo.after_layer_kv) {
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "writing the KV cache");
      fo.after_layer_kv(config.num_hidden_layers);
    }
    return cuda_model::CudaStatus(cudaStreamSynchronize(stream), "keeping hidden states");
  }
  RETURN_IF_ERROR(MtpPass(seqs, fo));
  return cuda_model::CudaStatus(cudaStreamSynchronize(stream), "the MTP layer");
}

absl::Status CudaDeepseekModel::Impl::AllocateMtpBuffers() {
  if (kept_hidden_.bytes() > 0) return absl::OkStatus();
  const size_t rows = static_cast<size_t>(options.max_batch_tokens), hidden = static_cast<size_t>(config.hidden_size);
  RETURN_IF_ERROR(kept_hidden_.Allocate(rows * hidden * sizeof(float), "kept hidden states"));
  RETURN_IF_ERROR(mtp_in_.Allocate(rows * hidden * sizeof(float), "the MTP layer's inputs"));
  RETURN_IF_ERROR(mtp_both_.Allocate(2 * rows * 2 * hidden * sizeof(__nv_bfloat16), "the MTP layer's inputs"));
  const size_t draft_bytes = static_cast<size_t>(max_logit_rows) * (2 * sizeof(int32_t) + sizeof(float));
  RETURN_IF_ERROR(draft_dev_.Allocate(draft_bytes, "drafts"));
  RETURN_IF_ERROR(draft_host_.Allocate(draft_bytes, "drafts"));
  activation_bytes += kept_hidden_.bytes() + mtp_in_.bytes() + mtp_both_.bytes() + draft_dev_.bytes();
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::MtpPass(std::span<const MtpRows> seqs, const DeepseekForwardOptions& fo) {
  const ModelConfig& c = config;
  const cuda_model::CudaMtpWeights& w = *weights->mtp;
  const int64_t hidden = c.hidden_size, layer = c.num_hidden_layers;
  int64_t rows = 0, table_rows = 0;
  for (const MtpRows& s : seqs) {
    rows += s.count;
    table_rows += s.count == 1 ? 1 : (s.count + kAbsorbedChunk - 1) / kAbsorbedChunk;
  }
  if (rows > options.max_batch_tokens || table_rows > max_table_rows) {
    return absl::InvalidArgumentError(absl::StrCat("an MTP pass of ", rows, " rows exceeds max_batch_tokens ",
                                                   options.max_batch_tokens));
  }
  StepPlan plan;
  plan.kv_offset = 1;
  plan.rows = rows;
  plan.table_rows = table_rows;
  plan.meta = cuda_model::LayoutMeta(meta_dev_.get<char>(), rows, 0, table_rows, max_blocks_per_seq, &plan.meta_bytes);
  size_t unused = 0;
  const StepMeta host = cuda_model::LayoutMeta(meta_host_.get<char>(), rows, 0, table_rows, max_blocks_per_seq, &unused);
  // Rows in `seqs`' order. The single rows leading them share one absorbed launch (a
  // chained draft pass is all single rows); every other sequence is absorbed in chunks.
  int64_t singles = 0;
  while (singles < static_cast<int64_t>(seqs.size()) && seqs[static_cast<size_t>(singles)].count == 1) ++singles;
  int64_t r = 0;
  for (const MtpRows& s : seqs) {
    for (int64_t j = 0; j < s.count; ++j) {
      const int64_t slot = s.first_slot + j;
      host.tokens[r + j] = s.tokens[static_cast<size_t>(j)];
      host.positions[r + j] = static_cast<int32_t>(slot - 1);
      host.slots[r + j] = static_cast<int32_t>(s.block_table[slot / kBlock] * kBlock + slot % kBlock);
    }
    r += s.count;
  }
  // A table row of positions [0, len): slots [1, len] of the sequence's blocks.
  auto put_table = [&](int64_t row, const MtpRows& s, int64_t len) {
    const int64_t blocks = std::min<int64_t>(static_cast<int64_t>(s.block_table.size()), len / kBlock + 1);
    std::memcpy(host.block_tables + row * max_blocks_per_seq, s.block_table.data(), blocks * sizeof(int32_t));
    host.cache_lens[row] = static_cast<int32_t>(len);
  };
  int64_t table_row = 0, max_single = 0;
  r = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    const MtpRows& s = seqs[k];
    if (static_cast<int64_t>(k) < singles) {
      put_table(table_row++, s, s.first_slot);
      max_single = std::max(max_single, s.first_slot);
    } else {
      for (int64_t c0 = 0; c0 < s.count; c0 += kAbsorbedChunk) {
        const int64_t m = std::min(kAbsorbedChunk, s.count - c0);
        const int64_t len = s.first_slot + c0 + m - 1;  // positions through the chunk's last row's
        put_table(table_row, s, len);
        plan.jobs.push_back({.absorbed = true, .row_begin = r + c0, .num_seqs = 1, .q_per_seq = m,
                             .table_row = table_row, .max_cache_len = len});
        ++table_row;
      }
    }
    r += s.count;
  }
  if (singles > 0) {
    plan.jobs.insert(plan.jobs.begin(), AttentionJob{.absorbed = true, .row_begin = 0, .num_seqs = singles,
                                                     .q_per_seq = 1, .table_row = 0, .max_cache_len = max_single});
  }
  for (const AttentionJob& j : plan.jobs) plan.rope_out_rows = std::max(plan.rope_out_rows, j.row_begin + j.num_seqs * j.q_per_seq);
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(meta_dev_.get(), meta_host_.get(), plan.meta_bytes, cudaMemcpyHostToDevice, stream),
                     "uploading the MTP pass");

  // x = eh_proj [enorm(embed(token)) | hnorm(previous hidden state)].
  const bool split = rows <= options.split_activations_max_tokens;
  __nv_bfloat16* both = mtp_both_.get<__nv_bfloat16>();
  __nv_bfloat16* both_lo = both + options.max_batch_tokens * 2 * hidden;
  TANDEM_CUDA_RETURN(cuda::EmbeddingGather({.table = w.embed.data, .tokens = plan.meta.tokens, .num_tokens = rows,
                                            .dim = hidden, .out = act_.x, .out_stride = hidden},
                                           stream),
                     "MTP embedding");
  const float eps = static_cast<float>(c.rms_norm_eps);
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = w.enorm, .rows = rows, .dim = hidden, .x_stride = hidden,
                                    .out_stride = 2 * hidden, .eps = eps, .out_bf16 = both,
                                    .out_bf16_lo = split ? both_lo : nullptr},
                                   stream),
                     "MTP enorm");
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = mtp_in_.get<float>(), .weight = w.hnorm, .rows = rows, .dim = hidden,
                                    .x_stride = hidden, .out_stride = 2 * hidden, .eps = eps,
                                    .out_bf16 = both + hidden, .out_bf16_lo = split ? both_lo + hidden : nullptr},
                                   stream),
                     "MTP hnorm");
  RETURN_IF_ERROR(Dense(w.eh_proj, both, split ? both_lo : nullptr, 2 * hidden, rows, act_.x, hidden, Out::kF32));
  RETURN_IF_ERROR(Mark("MTP eh_proj"));

  RETURN_IF_ERROR(Attention(layer, plan));
  if (fo.after_layer_kv) {
    if (!fo.after_layer_kv_enqueues_only) {
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "writing the KV cache");
    }
    fo.after_layer_kv(layer);
  }
  if (weights->layers[layer].moe) return Moe(layer, plan);
  return Mlp(layer, plan);
}

absl::StatusOr<std::vector<DraftToken>> CudaDeepseekModel::Impl::MtpDrafts(
    std::span<const int32_t> rows, std::span<const std::span<const uint32_t>> masks) {
  const ModelConfig& c = config;
  const cuda_model::CudaMtpWeights& w = *weights->mtp;
  const int64_t count = static_cast<int64_t>(rows.size()), hidden = c.hidden_size;
  if (count > max_logit_rows) return absl::InvalidArgumentError("too many sequences drafting at once");
  int32_t* row_index = draft_dev_.get<int32_t>();
  int32_t* token = row_index + max_logit_rows;
  float* confidence = reinterpret_cast<float*>(token + max_logit_rows);
  std::memcpy(draft_host_.get<int32_t>(), rows.data(), count * sizeof(int32_t));
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(row_index, draft_host_.get(), count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     stream),
                     "uploading draft rows");
  const bool split = count <= options.split_activations_max_tokens;
  TANDEM_CUDA_RETURN(cuda::RmsNorm({.x = act_.x, .weight = w.shared_head_norm, .rows = count, .dim = hidden,
                                    .x_stride = hidden, .out_stride = hidden, .eps = static_cast<float>(c.rms_norm_eps),
                                    .out_bf16 = act_.final_bf16, .row_index = row_index,
                                    .out_bf16_lo = split ? act_.final_lo : nullptr},
                                   stream),
                     "MTP shared head norm");
  RETURN_IF_ERROR(Dense(w.shared_head, act_.final_bf16, split ? act_.final_lo : nullptr, hidden, count, act_.logits,
                        c.vocab_size, Out::kF32));
  RETURN_IF_ERROR(MaskDraftLogits(masks));
  TANDEM_CUDA_RETURN(cuda::DraftChoice({.logits = act_.logits, .stride = c.vocab_size, .rows = count,
                                        .vocab = c.vocab_size, .token = token, .confidence = confidence},
                                       stream),
                     "draft choice");
  // Tokens then confidences, read back together.
  int32_t* host_token = draft_host_.get<int32_t>() + max_logit_rows;
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(host_token, token, max_logit_rows * sizeof(int32_t) + count * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream),
                     "reading drafts");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "drafting");
  const float* host_confidence = reinterpret_cast<const float*>(host_token + max_logit_rows);
  std::vector<DraftToken> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = {.token = host_token[i], .confidence = host_confidence[i]};
  return out;
}

absl::Status CudaDeepseekModel::Impl::MaskDraftLogits(std::span<const std::span<const uint32_t>> masks) {
  size_t words = 0;
  for (std::span<const uint32_t> m : masks) words = std::max(words, m.size());
  if (words == 0) return absl::OkStatus();
  // Host: [rows] slots, then [rows][words] masks (a shorter mask's missing words allow
  // nothing, as the grammar's do).
  const size_t rows = masks.size();
  const size_t bytes = rows * sizeof(int32_t) + rows * words * sizeof(uint32_t);
  if (draft_mask_host_.bytes() < bytes) {
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "drafting");
    RETURN_IF_ERROR(draft_mask_host_.Allocate(bytes, "draft masks"));
    RETURN_IF_ERROR(draft_mask_dev_.Allocate(bytes, "draft masks"));
  }
  int32_t* slot = draft_mask_host_.get<int32_t>();
  uint32_t* bits = reinterpret_cast<uint32_t*>(slot + rows);
  std::memset(bits, 0, rows * words * sizeof(uint32_t));
  for (size_t r = 0; r < rows; ++r) {
    slot[r] = masks[r].empty() ? -1 : static_cast<int32_t>(r);
    std::copy(masks[r].begin(), masks[r].end(), bits + r * words);
  }
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(draft_mask_dev_.get(), draft_mask_host_.get(), bytes, cudaMemcpyHostToDevice, stream),
                     "uploading draft masks");
  const int32_t* dev_slot = draft_mask_dev_.get<int32_t>();
  return cuda_model::CudaStatus(
      cuda::ApplyTokenMasks({.logits = act_.logits, .stride = config.vocab_size, .rows = static_cast<int>(rows),
                             .vocab = static_cast<int>(config.vocab_size), .row_slot = dev_slot,
                             .masks = reinterpret_cast<const uint32_t*>(dev_slot + rows),
                             .words = static_cast<int>(words)},
                            stream),
      "masking drafts");
}

absl::StatusOr<std::vector<std::vector<DraftToken>>> CudaDeepseekModel::Impl::Draft(
    std::span<const DraftSequence> batch) {
  const ModelConfig& c = config;
  const int64_t hidden = c.hidden_size;
  if (!weights->mtp) {
    return absl::FailedPreconditionError("a draft pass needs the MTP layer, which this model was loaded without");
  }
  TANDEM_CUDA_RETURN(cudaSetDevice(options.device), "selecting the GPU");
  RETURN_IF_ERROR(AllocateMtpBuffers());
  if (static_cast<int64_t>(batch.size()) > options.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("draft pass of ", batch.size(), " sequences exceeds max_seqs ",
                                                   options.max_seqs));
  }
  std::vector<MtpRows> seqs;
  int64_t in_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequence& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, " has no slots"));
    const int64_t last = s.first_slot + n - 1 + std::max(0, s.max_drafts - 1);
    if (s.first_slot < 1 || last >= std::min(c.max_position_embeddings, max_context)) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": slots [", s.first_slot, ", ", last,
                                                     "] are outside [1, ", std::min(c.max_position_embeddings,
                                                                                    max_context), ")"));
    }
    if (static_cast<int64_t>(s.block_table.size()) * kBlock <= last) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": ", s.block_table.size(),
                                                     " cache blocks cannot hold slot ", last));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": block id ", b, " out of range"));
      }
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary (size ",
                                                       c.vocab_size, ")"));
      }
    }
    if (s.hidden.size() % static_cast<size_t>(hidden) != 0 || static_cast<int64_t>(s.hidden.size()) > n * hidden) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": ", s.hidden.size(),
                                                     " hidden values are not whole rows of ", hidden, " for ", n,
                                                     " slots"));
    }
    for (float v : s.hidden) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": a hidden value is not finite"));
      }
    }
    const int64_t given = static_cast<int64_t>(s.hidden.size()) / hidden;
    const int64_t kept = n - given;
    if (kept > 0 && (s.hidden_row < 0 || s.hidden_row + kept > kept_rows_)) {
      return absl::InvalidArgumentError(absl::StrCat("draft sequence ", i, ": hidden rows [", s.hidden_row, ", ",
                                                     s.hidden_row + kept, ") were not kept (", kept_rows_, " were)"));
    }
    if (in_row + n > options.max_batch_tokens) {
      return absl::InvalidArgumentError("a draft pass beyond max_batch_tokens rows");
    }
    float* dst = mtp_in_.get<float>() + in_row * hidden;
    if (given > 0) {
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, s.hidden.data(), s.hidden.size() * sizeof(float), cudaMemcpyHostToDevice,
                                         stream),
                         "uploading hidden states");
    }
    if (kept > 0) {
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst + given * hidden, kept_hidden_.get<float>() + s.hidden_row * hidden,
                                         kept * hidden * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                         "gathering kept hidden states");
    }
    seqs.push_back({.first_slot = s.first_slot, .count = n, .tokens = s.tokens,
                    .block_table = s.block_table});
    in_row += n;
  }
  RETURN_IF_ERROR(MtpPass(seqs, {}));

  std::vector<std::vector<DraftToken>> drafts(batch.size());
  struct Chain {
    size_t seq;        // in batch
    int32_t last_row;  // of act_.x
    int64_t slot;      // of that row
  };
  std::vector<Chain> active;
  int64_t r = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    r += seqs[i].count;
    if (batch[i].max_drafts > 0) {
      active.push_back({i, static_cast<int32_t>(r - 1), seqs[i].first_slot + seqs[i].count - 1});
    }
  }
  std::vector<int32_t> next_tokens;
  while (!active.empty()) {
    // Constrained sequences: the mask of this draft (DraftSequence::allowed); an empty one
    // ends the sequence's drafting.
    std::vector<Chain> drafting;
    std::vector<std::span<const uint32_t>> masks;
    for (const Chain& a : active) {
      const DraftSequence& s = batch[a.seq];
      std::span<const uint32_t> mask;
      if (s.allowed) {
        const std::vector<DraftToken>& out = drafts[a.seq];
        mask = s.allowed(out.empty() ? -1 : out.back().token);
        if (mask.empty()) continue;
      }
      drafting.push_back(a);
      masks.push_back(mask);
    }
    active = std::move(drafting);
    if (active.empty()) break;
    std::vector<int32_t> rows;
    for (const Chain& a : active) rows.push_back(a.last_row);
    ASSIGN_OR_RETURN(std::vector<DraftToken> chosen, MtpDrafts(rows, masks));
    std::vector<Chain> next;
    std::vector<MtpRows> pass;
    next_tokens.clear();
    next_tokens.reserve(active.size());
    for (size_t k = 0; k < active.size(); ++k) {
      const DraftSequence& s = batch[active[k].seq];
      // (A probability of 0: the mask allowed nothing.)
      if (!(chosen[k].confidence > 0.0f) || chosen[k].confidence < s.min_confidence) continue;
      std::vector<DraftToken>& out = drafts[active[k].seq];
      out.push_back(chosen[k]);
      if (static_cast<int32_t>(out.size()) == s.max_drafts) continue;
      // The next slot from this row's output and its draft.
      const int64_t row = static_cast<int64_t>(next.size());
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(act_.h_f32 + row * hidden, act_.x + active[k].last_row * hidden,
                                         hidden * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                         "chaining drafts");
      next_tokens.push_back(chosen[k].token);
      next.push_back({active[k].seq, static_cast<int32_t>(row), active[k].slot + 1});
    }
    if (next.empty()) break;
    for (size_t k = 0; k < next.size(); ++k) {
      pass.push_back({.first_slot = next[k].slot, .count = 1,
                      .tokens = std::span<const int32_t>(&next_tokens[k], 1),
                      .block_table = batch[next[k].seq].block_table});
    }
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(mtp_in_.get<float>(), act_.h_f32, next.size() * hidden * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream),
                       "chaining drafts");
    RETURN_IF_ERROR(MtpPass(pass, {}));
    active = std::move(next);
  }
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "drafting");
  return drafts;
}

absl::StatusOr<std::vector<float>> CudaDeepseekModel::Impl::KeptHidden(int64_t row) {
  const int64_t hidden = config.hidden_size;
  if (row < 0 || row >= kept_rows_) return absl::InvalidArgumentError(absl::StrCat("hidden row ", row, " was not kept"));
  std::vector<float> out(static_cast<size_t>(hidden));
  TANDEM_CUDA_RETURN(cudaMemcpy(out.data(), kept_hidden_.get<float>() + row * hidden, hidden * sizeof(float),
                                cudaMemcpyDeviceToHost),
                     "reading a hidden state");
  return out;
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<std::vector<std::vector<DraftToken>>> CudaDeepseekModel::Draft(std::span<const DraftSequence> batch) {
  return impl_->Draft(batch);
}
absl::StatusOr<std::vector<float>> CudaDeepseekModel::KeptHidden(int64_t row) { return impl_->KeptHidden(row); }
bool CudaDeepseekModel::has_mtp() const { return impl_->weights->mtp.has_value(); }

}  // namespace tandem
