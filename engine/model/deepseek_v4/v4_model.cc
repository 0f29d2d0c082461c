#include "engine/model/deepseek_v4/v4_model.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/model/deepseek_v4/v4_attention.h"
#include "engine/model/deepseek_v4/v4_moe.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm_rope_act.h"

namespace tandem::v4 {

absl::StatusOr<std::unique_ptr<DeepseekV4Model>> DeepseekV4Model::Load(const std::string& dir,
                                                                       const LoadOptions& options) {
  std::unique_ptr<DeepseekV4Model> model(new DeepseekV4Model());
  ASSIGN_OR_RETURN(model->config_, LoadDeepseekV4Config(dir));
  ASSIGN_OR_RETURN(model->loaded_, LoadedWeights::Load(model->config_, dir));
  model->pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  model->fp8_activation_rounding_ = options.fp8_activation_rounding;
  model->main_rope_ = Rope(model->config_.main_rope);
  model->compress_rope_ = Rope(model->config_.compress_rope);
  return model;
}

SequenceState DeepseekV4Model::NewSequence() const {
  SequenceState s;
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) s.layers.push_back(NewLayerState(config_, config_.layer_types[l]));
  return s;
}

absl::Status DeepseekV4Model::Check(std::span<const int32_t> tokens, int64_t start) const {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " is ", tokens[i], ", outside the vocabulary of ", config_.vocab_size));
    }
  }
  if (start + static_cast<int64_t>(tokens.size()) > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("positions up to ", start + static_cast<int64_t>(tokens.size()),
                                                   " exceed max_position_embeddings (",
                                                   config_.max_position_embeddings, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DeepseekV4Model::ForwardFull(std::span<const int32_t> tokens) {
  RETURN_IF_ERROR(Check(tokens, 0));
  return Run(tokens, 0, nullptr, /*all_logits=*/true, {});
}

absl::StatusOr<std::vector<float>> DeepseekV4Model::Forward(std::span<const int32_t> tokens, SequenceState& state,
                                                            bool all_logits) {
  return Forward(tokens, state, all_logits, {});
}

absl::StatusOr<std::vector<float>> DeepseekV4Model::Forward(std::span<const int32_t> tokens, SequenceState& state,
                                                            bool all_logits, const ForwardExtras& extras) {
  RETURN_IF_ERROR(Check(tokens, state.num_tokens));
  if (state.layers.empty() && state.num_tokens == 0) state = NewSequence();
  TANDEM_CHECK_EQ(static_cast<int64_t>(state.layers.size()), config_.num_hidden_layers);
  if (extras.undo != nullptr) {
    TANDEM_CHECK_LE(static_cast<int64_t>(tokens.size()), config_.sliding_window);
    *extras.undo = StateUndo{.from = std::max(extras.undo_from, state.num_tokens),
                             .end = state.num_tokens + static_cast<int64_t>(tokens.size()),
                             .layers = std::vector<LayerUndo>(static_cast<size_t>(config_.num_hidden_layers))};
  }
  std::vector<float> logits = Run(tokens, state.num_tokens, &state, all_logits, extras);
  state.num_tokens += static_cast<int64_t>(tokens.size());
  return logits;
}

void DeepseekV4Model::HyperPre(const HyperConnectionWeights& w, const float* streams, int64_t rows, float* post,
                               float* comb, float* u) {
  const int64_t n = config_.hc_mult, d = config_.hidden_size, mix_width = (2 + n) * n;
  const float eps = static_cast<float>(config_.rms_norm_eps), hc_eps = static_cast<float>(config_.hc_eps);
  std::vector<float> flat(streams, streams + rows * n * d), mix(static_cast<size_t>(rows * mix_width));
  for (int64_t t = 0; t < rows; ++t) UnitRmsNorm(&flat[t * n * d], n * d, eps);
  cpu::Matmul({.x = flat.data(), .m = rows, .x_stride = n * d, .w = &w.fn, .y = mix.data(), .y_stride = mix_width},
              *pool_);
  std::vector<float> pre(static_cast<size_t>(n));
  for (int64_t t = 0; t < rows; ++t) {
    HyperConnectionMix(&mix[t * mix_width], w.base, w.scale, n, config_.hc_sinkhorn_iters, hc_eps, pre.data(),
                           post + t * n, comb + t * n * n);
    CollapseStreams(streams + t * n * d, pre.data(), n, d, u + t * d);
  }
}

void DeepseekV4Model::Block(const LayerWeights& lw, AttentionType type, MlpType mlp, std::span<const int32_t> tokens,
                            int64_t start, LayerState* state, LayerUndo* undo, int64_t undo_from, float* streams) {
  const DeepseekV4Config& c = config_;
  const int64_t s = static_cast<int64_t>(tokens.size()), n = c.hc_mult, d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> post(static_cast<size_t>(s * n)), comb(static_cast<size_t>(s * n * n));
  std::vector<float> u(static_cast<size_t>(s * d)), sub(static_cast<size_t>(s * d)), scratch(static_cast<size_t>(n * d));
  auto expand = [&] {
    for (int64_t t = 0; t < s; ++t) {
      ExpandStreams(&streams[t * n * d], &post[t * n], &comb[t * n * n], &sub[t * d], n, d, scratch.data());
    }
  };
  HyperPre(lw.attn_hc, streams, s, post.data(), comb.data(), u.data());
  cpu::RmsNorm(u.data(), s, d, d, lw.attn_norm, eps, u.data(), d);
  RunAttention({.config = &c, .weights = &lw.attention, .type = type,
                .rope = type == AttentionType::kSliding ? &main_rope_ : &compress_rope_,
                .compress_rope = &compress_rope_, .x = u.data(), .rows = s, .start_position = start,
                .state = state, .out = sub.data(), .undo = undo, .undo_from = undo_from,
                .round_fp8_input = fp8_activation_rounding_},
               *pool_);
  expand();
  HyperPre(lw.ffn_hc, streams, s, post.data(), comb.data(), u.data());
  cpu::RmsNorm(u.data(), s, d, d, lw.ffn_norm, eps, u.data(), d);
  RunMoe({.config = &c, .weights = &lw.moe, .type = mlp, .x = u.data(), .tokens = tokens.data(), .rows = s,
          .out = sub.data(), .round_fp8_input = fp8_activation_rounding_},
         *pool_);
  expand();
}

std::vector<float> DeepseekV4Model::Logits(const HyperHeadWeights& hc_head, const float* norm, const float* streams,
                                           int64_t rows) {
  const DeepseekV4Config& c = config_;
  const int64_t n = c.hc_mult, d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> flat(streams, streams + rows * n * d), mix(static_cast<size_t>(rows * n));
  for (int64_t t = 0; t < rows; ++t) UnitRmsNorm(&flat[t * n * d], n * d, eps);
  cpu::Matmul({.x = flat.data(), .m = rows, .x_stride = n * d, .w = &hc_head.fn, .y = mix.data(), .y_stride = n},
              *pool_);
  std::vector<float> pre(static_cast<size_t>(n)), h(static_cast<size_t>(rows * d));
  for (int64_t t = 0; t < rows; ++t) {
    HyperHeadMix(&mix[t * n], hc_head.base, hc_head.scale[0], n, static_cast<float>(c.hc_eps), pre.data());
    CollapseStreams(&streams[t * n * d], pre.data(), n, d, &h[t * d]);
  }
  cpu::RmsNorm(h.data(), rows, d, d, norm, eps, h.data(), d);
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));
  cpu::Matmul({.x = h.data(), .m = rows, .x_stride = d, .w = &weights().head, .y = logits.data(),
               .y_stride = c.vocab_size},
              *pool_);
  return logits;
}

std::vector<float> DeepseekV4Model::Run(std::span<const int32_t> tokens, int64_t start, SequenceState* state,
                                        bool all_logits, const ForwardExtras& extras) {
  const ModelWeights& w = loaded_->weights();
  const DeepseekV4Config& c = config_;
  const int64_t s = static_cast<int64_t>(tokens.size()), n = c.hc_mult, d = c.hidden_size;

  // Every stream starts as the token's embedding.
  std::vector<float> streams(static_cast<size_t>(s * n * d));
  for (int64_t t = 0; t < s; ++t) {
    cpu::DequantizeRows(w.embed, tokens[t], 1, &streams[t * n * d]);
    for (int64_t k = 1; k < n; ++k) std::memcpy(&streams[(t * n + k) * d], &streams[t * n * d], d * sizeof(float));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerUndo* undo = extras.undo != nullptr ? &extras.undo->layers[l] : nullptr;
    Block(w.layers[l], c.layer_types[l], c.mlp_layer_types[l], tokens, start,
          state != nullptr ? &state->layers[l] : nullptr, undo, extras.undo_from, streams.data());
  }
  if (extras.hidden != nullptr) *extras.hidden = streams;

  // The hyper head collapses the streams; then the final norm and the LM head.
  const int64_t first = all_logits ? 0 : s - 1;
  return Logits(w.hc_head, w.norm, &streams[first * n * d], s - first);
}

LayerState DeepseekV4Model::NewMtpState() const { return NewLayerState(config_, config_.mtp_attention_type); }

std::vector<float> DeepseekV4Model::RunMtp(const float* hidden, std::span<const int32_t> tokens, int64_t start,
                                           LayerState& state, std::vector<float>* streams_out, bool logits) {
  TANDEM_CHECK(has_mtp());
  const MtpWeights& m = loaded_->weights().mtp.front();
  const DeepseekV4Config& c = config_;
  const int64_t rows = static_cast<int64_t>(tokens.size()), n = c.hc_mult, d = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Stream k of row r: e_proj(enorm(embed(token))) + h_proj(hnorm(hidden stream k)).
  std::vector<float> e(static_cast<size_t>(rows * d)), ep(e.size());
  for (int64_t r = 0; r < rows; ++r) cpu::DequantizeRows(weights().embed, tokens[r], 1, &e[r * d]);
  cpu::RmsNorm(e.data(), rows, d, d, m.enorm, eps, e.data(), d);
  cpu::Matmul({.x = e.data(), .m = rows, .x_stride = d, .w = &m.e_proj, .y = ep.data(), .y_stride = d}, *pool_);
  std::vector<float>& x = *streams_out;
  x.resize(static_cast<size_t>(rows * n * d));
  std::vector<float> normed(x.size());
  cpu::RmsNorm(hidden, rows * n, d, d, m.hnorm, eps, normed.data(), d);
  cpu::Matmul({.x = normed.data(), .m = rows * n, .x_stride = d, .w = &m.h_proj, .y = x.data(), .y_stride = d},
              *pool_);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < n; ++k) {
      float* xs = &x[(r * n + k) * d];
      for (int64_t i = 0; i < d; ++i) xs[i] = ep[r * d + i] + xs[i];
    }
  }
  Block(m.block, c.mtp_attention_type, MlpType::kMoe, tokens, start, &state, nullptr, 0, x.data());
  if (!logits) return {};
  return Logits(m.hc_head, m.norm, &x[(rows - 1) * n * d], 1);
}

}  // namespace tandem::v4
