// `tandem make-model --mtp-acceptance P`: a DeepSeek-V3 checkpoint built so that
// speculative decoding with its MTP module runs at a known acceptance rate (random
// weights draft nothing the main model accepts). A test construction, not a language
// model; config.json records it under "tandem_mtp_test".
//
// - Tokens. The regular tokens are the ids the tokenizer knows that are neither added
//   (special) tokens nor BOS/EOS. The successor f puts them on one cycle (Sattolo's
//   algorithm over their ids in order, keyed by the seed): f never maps a token to
//   itself or to a special one, and following f from any token visits every regular
//   token before returning. A token outside the regular set (BOS, a chat marker, an id
//   past the tokenizer's) behaves as its alias, a regular token chosen by the seed: the
//   same vector, the same successor.
// - Main model. Token t has a vector u_t (normal, scaled to RMS 1: nearly orthogonal to
//   the others in hidden space); embed_tokens row t = u_t and lm_head row f(t) =
//   head_scale * u_t, so when the last hidden state is close to u_t the greedy next token
//   is f(t), about kMtpTestTargetMargin nats above the runner-up on a typical token (at
//   least 7 on every token of the tiny preset's shapes; mtp_test_model_test). Every norm
//   weight is 1. The decoder layers keep their random weights (the same compute and
//   memory traffic) but o_proj and every down_proj are scaled by
//   kMtpTestLayerOutputScale, which keeps their sum on the residual stream small next to
//   u_t: from any prompt the greedy continuation is f(t), f(f(t)), ...
// - MTP module (each of num_nextn_predict_layers). eh_proj = [I | 0] plus noise of
//   kMtpTestLayerOutputScale times the usual init, so its output is the normalized
//   embedding of the token it is given; its decoder block is scaled as the main ones;
//   shared_head.head = lm_head; its own embed_tokens row t holds u_t for a "good" token
//   and u_g(t) for a bad one (g(t) another regular token, so f(g(t)) != f(t)). Given token
//   t it drafts f(t), which the main model accepts, for good tokens and f(g(t)) for bad
//   ones. The good tokens are a random subset of density P: about P of first drafts are
//   accepted under greedy decoding, about P^j of chains of j drafts. (At temperature 1
//   the main model keeps about 1% of its probability off f(t) with DeepSeek-V3's 129280
//   tokens, 0.1% with 1024: sampled acceptance is that much below.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "kernels/common/dtype.h"
#include "nlohmann/json.hpp"

namespace tandem {

// The factor on o_proj and down_proj (main layers and the MTP block) and on eh_proj's
// noise. With 1e-2 the layers move the margins by hundredths of a nat on the tiny
// preset (1e-1 still passes mtp_test_model_test, 1 does not), so the margin left is the
// token vectors' own.
inline constexpr float kMtpTestLayerOutputScale = 1e-2f;
// The margin, in nats, of the successor's logit over the expected runner-up.
inline constexpr double kMtpTestTargetMargin = 10.0;
// config.json's key for the construction's record.
inline constexpr const char* kMtpTestConfigKey = "tandem_mtp_test";

// What config.json records of the construction: enough to recompute every table below.
struct MtpTestModelSpec {
  double acceptance = 0.0;  // P, the density of good tokens
  uint64_t seed = 0;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  std::vector<std::pair<int32_t, int32_t>> regular_token_ranges;  // [begin, end), ascending
};

// Why make-model cannot write the construction for these options, as INVALID_ARGUMENT
// naming --mtp-acceptance: P outside [0, 1], a model_type other than deepseek_v3, no MTP
// layer, tied embeddings (the embedding and the head differ here), a dtype other than
// bf16 or f32 (bf16 only for weights generated on the GPU).
absl::Status CheckMtpTestModelOptions(const ModelConfig& config, double acceptance, DType dtype,
                                      bool write_weights);

// The construction for a checkpoint whose tokenizer files are in `dir`. Errors:
// INVALID_ARGUMENT when fewer than 3 regular tokens remain, or hidden_size is too small
// for their number to keep the successor's margin; the tokenizer's load errors.
absl::StatusOr<MtpTestModelSpec> PlanMtpTestModel(const ModelConfig& config, const std::string& dir,
                                                  double acceptance, uint64_t seed);

// config.json's record of the construction, and the spec back from config.json's text.
// Errors of the reader: NOT_FOUND when there is no record; INVALID_ARGUMENT for a
// malformed one.
nlohmann::ordered_json MtpTestRecord(const MtpTestModelSpec& spec);
absl::StatusOr<MtpTestModelSpec> ReadMtpTestModelSpec(std::string_view config_json);

// The per-token tables: what the checkpoint's tensors are built from, and what a test
// expects of a model running it.
class MtpTestTokens {
 public:
  explicit MtpTestTokens(const MtpTestModelSpec& spec);

  int64_t vocab_size() const { return static_cast<int64_t>(successor_.size()); }
  int64_t num_regular() const { return static_cast<int64_t>(regular_.size()); }
  bool IsRegular(int32_t token) const { return regular_index_[token] >= 0; }
  // f: the main model's greedy next token after `token`.
  int32_t Successor(int32_t token) const { return successor_[token]; }
  // Whether the MTP module, given `token`, drafts its successor.
  bool MtpDraftsSuccessor(int32_t token) const { return mtp_vector_token_[token] == vector_token_[token]; }
  // The regular token whose vector u embed_tokens' row `token` holds: itself or its alias.
  int32_t VectorToken(int32_t token) const { return vector_token_[token]; }
  // The regular token whose vector the MTP's embed_tokens row `token` holds.
  int32_t MtpVectorToken(int32_t token) const { return mtp_vector_token_[token]; }
  // The regular token t with f(t) = `token` (whose vector lm_head's row holds), or -1
  // when `token` is not regular (its lm_head row is zero: nothing maps to it).
  int32_t HeadVectorToken(int32_t token) const { return head_vector_token_[token]; }

 private:
  std::vector<int32_t> regular_;
  std::vector<int32_t> regular_index_;  // per id: index in regular_, or -1
  std::vector<int32_t> successor_;
  std::vector<int32_t> vector_token_;
  std::vector<int32_t> mtp_vector_token_;
  std::vector<int32_t> head_vector_token_;
};

// The tensor values of the construction, applied by the generator to each tensor after it
// draws the usual random values.
class MtpTestWeights {
 public:
  MtpTestWeights(const MtpTestModelSpec& spec, const ModelConfig& config);

  // Rewrites `values` (tensor `name` of `shape`, row-major) where the construction sets
  // them; leaves the others (attention projections, gate/up, routers) as drawn.
  void Adjust(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>& values) const;

  const MtpTestTokens& tokens() const { return tokens_; }
  // lm_head row f(t) is head_scale * u_t.
  float head_scale() const { return head_scale_; }
  // u_token (`token` regular), hidden_size values of RMS 1.
  void TokenVector(int32_t token, float* out) const;

 private:
  void FillRows(std::vector<float>& values, float scale, int32_t (MtpTestTokens::*row_token)(int32_t) const) const;

  MtpTestModelSpec spec_;
  MtpTestTokens tokens_;
  int64_t num_hidden_layers_ = 0;
  int64_t num_mtp_layers_ = 0;
  float head_scale_ = 0.0f;
  uint64_t vector_key_ = 0;
};

// head_scale for `num_regular` tokens in `hidden_size` dimensions: kMtpTestTargetMargin
// over the expected gap between |u|^2 = hidden and the largest of num_regular - 1 random
// dot products (about sqrt(2 hidden ln n)); 0 when that gap is under a quarter of hidden
// (the margin would be luck).
float MtpTestHeadScale(int64_t hidden_size, int64_t num_regular);

}  // namespace tandem
