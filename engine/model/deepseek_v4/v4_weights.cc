#include "engine/model/deepseek_v4/v4_weights.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"

namespace tandem::v4 {

float Fp4E2m1ToF32(uint8_t code) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

namespace {

constexpr int64_t kFp4BlockSize = 32;  // one ue8m0 scale per 32 values along the input

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string TypeName(DType t) { return std::string(DTypeName(t)); }

bool IsFloatWeight(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

float ElementToF32(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, t.bytes.data() + 4 * i, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, t.bytes.data() + 2 * i, 2);
      return Bf16ToF32(v);
    }
    case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, t.bytes.data() + 2 * i, 2);
      return F16ToF32(v);
    }
    case DType::kF8E8M0: return F8E8M0ToF32(static_cast<uint8_t>(t.bytes[i]));
    default: TANDEM_CHECK(false) << "not a float tensor: " << TypeName(t.dtype);
  }
  return 0.0f;
}

}  // namespace

// Resolves official tensor names against the checkpoint's naming, checking shapes and
// types, and fills LoadedWeights.
class WeightResolver {
 public:
  WeightResolver(const DeepseekV4Config& config, LoadedWeights& out)
      : c_(config), out_(out), ckpt_(*out.checkpoint_), w_(out.weights_) {}

  absl::Status LoadAll() {
    RETURN_IF_ERROR(DetectNaming());
    const int64_t d = c_.hidden_size;
    ASSIGN_OR_RETURN(w_.embed, Matrix("embed.weight", c_.vocab_size, d));
    if (c_.tie_word_embeddings && Lookup("head.weight").first == nullptr) {
      w_.head = w_.embed;
    } else {
      ASSIGN_OR_RETURN(w_.head, Matrix("head.weight", c_.vocab_size, d));
    }
    ASSIGN_OR_RETURN(w_.norm, Floats("norm.weight", {d}));
    ASSIGN_OR_RETURN(w_.hc_head, HyperHead(""));
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      ASSIGN_OR_RETURN(LayerWeights layer,
                       Layer(absl::StrCat("layers.", i, "."), i, c_.layer_types[i], c_.mlp_layer_types[i]));
      w_.layers.push_back(std::move(layer));
    }
    // MTP layers: in official checkpoints only (transformers drops mtp.* when it loads
    // and so never saves them).
    for (int64_t j = 0; j < c_.num_nextn_predict_layers; ++j) {
      const std::string p = absl::StrCat("mtp.", j, ".");
      if (Lookup(p + "e_proj.weight").first == nullptr) continue;
      const std::set<std::string> before = used_;
      MtpWeights m;
      ASSIGN_OR_RETURN(m.e_proj, Matrix(p + "e_proj.weight", d, d));
      ASSIGN_OR_RETURN(m.h_proj, Matrix(p + "h_proj.weight", d, d));
      ASSIGN_OR_RETURN(m.enorm, Floats(p + "enorm.weight", {d}));
      ASSIGN_OR_RETURN(m.hnorm, Floats(p + "hnorm.weight", {d}));
      ASSIGN_OR_RETURN(m.norm, Floats(p + "norm.weight", {d}));
      ASSIGN_OR_RETURN(m.hc_head, HyperHead(p));
      ASSIGN_OR_RETURN(m.block, Layer(p, -1, c_.mtp_attention_type, MlpType::kMoe));
      for (const std::string& name : used_) {
        if (!before.contains(name)) m.tensors.push_back(name);
      }
      w_.mtp.push_back(std::move(m));
    }
    for (const auto& [name, view] : ckpt_.tensors()) {
      if (!used_.contains(name)) w_.unused_tensors.push_back(name);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status DetectNaming() {
    if (ckpt_.Find("embed.weight") != nullptr || ckpt_.Find("layers.0.attn.wq_a.weight") != nullptr) {
      w_.naming = TensorNaming::kOfficial;
    } else if (ckpt_.Find("model.layers.0.attn.wq_a.weight") != nullptr) {
      w_.naming = TensorNaming::kTransformersSaved;
    } else if (ckpt_.Find("model.layers.0.self_attn.q_a_proj.weight") != nullptr) {
      w_.naming = TensorNaming::kTransformersModules;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", ckpt_.dir(),
          "' has no DeepSeek-V4 tensors under a known naming (official 'layers.0.attn.wq_a.weight', "
          "transformers-saved 'model.layers.0.attn.wq_a.weight' or transformers' modules "
          "'model.layers.0.self_attn.q_a_proj.weight')"));
    }
    return absl::OkStatus();
  }

  // The tensor and the name it has in the checkpoint; nullptr when absent.
  std::pair<const TensorView*, std::string> Lookup(const std::string& official) const {
    const std::vector<std::string> names = CandidateNames(w_.naming, official);
    for (const std::string& name : names) {
      if (const TensorView* t = ckpt_.Find(name)) return {t, name};
    }
    return {nullptr, names.empty() ? official : names.front()};
  }

  absl::StatusOr<std::pair<const TensorView*, std::string>> Require(const std::string& official,
                                                                    const std::vector<int64_t>& shape) {
    auto [t, name] = Lookup(official);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", ckpt_.dir(), "' lacks tensor '", name, "'",
          name == official ? "" : absl::StrCat(" (DeepSeek-V4's ", official, ")"), ", expected with shape ",
          ShapeString(shape), " (tensor names: ", TensorNamingName(w_.naming), ")"));
    }
    Use(name, *t);
    return std::pair{t, name};
  }

  void Use(const std::string& name, const TensorView& t) {
    if (used_.insert(name).second) w_.weight_bytes += t.bytes.size();
  }

  static absl::Status ShapeError(const std::string& name, const TensorView& t, const std::vector<int64_t>& want,
                                 const std::string& note = "") {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ", ShapeString(t.shape),
                                                   ", but config.json implies ", ShapeString(want), note));
  }

  std::vector<float>& OwnF32(size_t n) {
    out_.owned_f32_.push_back(std::make_unique<std::vector<float>>(n));
    return *out_.owned_f32_.back();
  }

  // A float32 copy of a small tensor (norms, biases, sinks, position biases, mHC).
  absl::StatusOr<const float*> Floats(const std::string& official, const std::vector<int64_t>& shape) {
    ASSIGN_OR_RETURN(auto found, Require(official, shape));
    const auto& [t, name] = found;
    if (t->shape != shape) return ShapeError(name, *t, shape);
    if (!IsFloatWeight(t->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", TypeName(t->dtype),
                                                     "; it must be F32, BF16 or F16"));
    }
    std::vector<float>& v = OwnF32(static_cast<size_t>(t->numel()));
    for (int64_t i = 0; i < t->numel(); ++i) v[i] = ElementToF32(*t, i);
    return v.data();
  }

  // Block or group scales of a quantized weight `name`, as floats; shape [rows, cols].
  absl::StatusOr<const float*> Scales(const std::string& name, int64_t rows, int64_t cols, const char* what) {
    const TensorView* s = nullptr;
    std::string scale_name;
    for (const std::string& candidate : ScaleNames(name)) {
      if ((s = ckpt_.Find(candidate)) != nullptr) {
        scale_name = candidate;
        break;
      }
    }
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor '", name, "' lacks its scales ('",
                                                     absl::StrJoin(ScaleNames(name), "' or '"), "', shape [", rows,
                                                     ", ", cols, "])"));
    }
    if (s->shape != std::vector<int64_t>{rows, cols}) return ShapeError(scale_name, *s, {rows, cols});
    if (s->dtype != DType::kF8E8M0 && !IsFloatWeight(s->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", scale_name, "' is ", TypeName(s->dtype),
                                                     "; scales must be F8_E8M0, F32 or BF16"));
    }
    Use(scale_name, *s);
    std::vector<float>& v = OwnF32(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) {
      v[i] = ElementToF32(*s, i);
      if (!std::isfinite(v[i])) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", scale_name, "' holds a non-finite scale at ", i));
      }
    }
    return v.data();
  }

  absl::StatusOr<WeightMatrix> Matrix(const std::string& official, int64_t rows, int64_t cols) {
    ASSIGN_OR_RETURN(auto found, Require(official, {rows, cols}));
    return MatrixFrom(*found.first, found.second, rows, cols);
  }

  absl::StatusOr<WeightMatrix> MatrixFrom(const TensorView& t, const std::string& name, int64_t rows, int64_t cols) {
    WeightMatrix w;
    w.rows = rows;
    w.cols = cols;
    const std::vector<int64_t> shape = {rows, cols};
    switch (t.dtype) {
      case DType::kF32:
      case DType::kBF16:
      case DType::kF16: {
        if (t.shape != shape) return ShapeError(name, t, shape);
        w.dtype = t.dtype;
        w.data = t.bytes.data();
        if (t.dtype == DType::kF16) {  // the matrix products read F16 only through a dequantized copy
          std::vector<float>& f = OwnF32(static_cast<size_t>(rows * cols));
          cpu::DequantizeRows(w, 0, rows, f.data());
          w.dtype = DType::kF32;
          w.data = reinterpret_cast<const std::byte*>(f.data());
        }
        return w;
      }
      case DType::kF8E4M3: {
        if (t.shape != shape) return ShapeError(name, t, shape);
        ASSIGN_OR_RETURN(w.block_scales, Scales(name, CeilDiv(rows, cpu::kFp8BlockSize),
                                                CeilDiv(cols, cpu::kFp8BlockSize), "FP8"));
        w.dtype = DType::kF8E4M3;
        w.data = t.bytes.data();
        ++w_.fp8_matrices;
        return w;
      }
      case DType::kI8:
      case DType::kU8: {
        const std::vector<int64_t> packed = {rows, CeilDiv(cols, 2)};
        if (cols % 2 != 0 || t.shape != packed) {
          return ShapeError(name, t, packed, absl::StrCat(" (FP4 e2m1 packed two a byte for [", rows, ", ", cols, "])"));
        }
        const int64_t groups = CeilDiv(cols, kFp4BlockSize);
        ASSIGN_OR_RETURN(const float* scales, Scales(name, rows, groups, "FP4"));
        out_.owned_bf16_.push_back(std::make_unique<std::vector<uint16_t>>(static_cast<size_t>(rows * cols)));
        std::vector<uint16_t>& dst = *out_.owned_bf16_.back();
        const auto* src = reinterpret_cast<const uint8_t*>(t.bytes.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t col = 0; col < cols; ++col) {
            const uint8_t byte = src[r * (cols / 2) + col / 2];
            const uint8_t code = col % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
            // e2m1 values have at most two significant bits, so value * 2^k is exact
            // in bf16 as in float32.
            dst[r * cols + col] = F32ToBf16(Fp4E2m1ToF32(code) * scales[r * groups + col / kFp4BlockSize]);
          }
        }
        w.dtype = DType::kBF16;
        w.data = reinterpret_cast<const std::byte*>(dst.data());
        // The stored form too, where the bf16 widening is exact (every scale a power of
        // two, as ue8m0 scales are), so that a device reading it computes the same values.
        bool exact = true;
        for (int64_t i = 0; i < rows * groups && exact; ++i) {
          int e = 0;
          exact = scales[i] > 0.0f && std::frexp(scales[i], &e) == 0.5f;
        }
        if (exact) {
          w.fp4_codes = src;
          w.fp4_scales = scales;
        }
        ++w_.fp4_matrices;
        return w;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", name, "' is ", TypeName(t.dtype),
            "; a weight matrix must be F32, BF16, F16, F8_E4M3 with block scales, or FP4 packed in I8/U8 with scales"));
    }
  }

  absl::StatusOr<HyperConnectionWeights> HyperConnection(const std::string& p, const char* site) {
    const int64_t n = c_.hc_mult, mix = (2 + n) * n;
    HyperConnectionWeights h;
    ASSIGN_OR_RETURN(h.fn, Matrix(absl::StrCat(p, "hc_", site, "_fn"), mix, n * c_.hidden_size));
    ASSIGN_OR_RETURN(h.base, Floats(absl::StrCat(p, "hc_", site, "_base"), {mix}));
    ASSIGN_OR_RETURN(h.scale, Floats(absl::StrCat(p, "hc_", site, "_scale"), {3}));
    return h;
  }

  absl::StatusOr<HyperHeadWeights> HyperHead(const std::string& p) {
    const int64_t n = c_.hc_mult;
    HyperHeadWeights h;
    ASSIGN_OR_RETURN(h.fn, Matrix(p + "hc_head_fn", n, n * c_.hidden_size));
    ASSIGN_OR_RETURN(h.base, Floats(p + "hc_head_base", {n}));
    ASSIGN_OR_RETURN(h.scale, Floats(p + "hc_head_scale", {1}));
    return h;
  }

  absl::StatusOr<CompressorWeights> Compressor(const std::string& p, int64_t width, int64_t proj_width, int64_t rate) {
    CompressorWeights cw;
    ASSIGN_OR_RETURN(cw.kv_proj, Matrix(p + "wkv.weight", proj_width, c_.hidden_size));
    ASSIGN_OR_RETURN(cw.gate_proj, Matrix(p + "wgate.weight", proj_width, c_.hidden_size));
    ASSIGN_OR_RETURN(cw.position_bias, Floats(p + "ape", {rate, proj_width}));
    ASSIGN_OR_RETURN(cw.norm, Floats(p + "norm.weight", {width}));
    return cw;
  }

  absl::StatusOr<AttentionWeights> Attention(const std::string& p, AttentionType type) {
    const int64_t dm = c_.hidden_size, hd = c_.num_attention_heads * c_.head_dim, d = c_.head_dim;
    const int64_t g = c_.o_groups, r = c_.o_lora_rank;
    AttentionWeights a;
    const std::string s = p + "attn.";
    ASSIGN_OR_RETURN(a.q_a_proj, Matrix(s + "wq_a.weight", c_.q_lora_rank, dm));
    ASSIGN_OR_RETURN(a.q_a_norm, Floats(s + "q_norm.weight", {c_.q_lora_rank}));
    ASSIGN_OR_RETURN(a.q_b_proj, Matrix(s + "wq_b.weight", hd, c_.q_lora_rank));
    ASSIGN_OR_RETURN(a.kv_proj, Matrix(s + "wkv.weight", d, dm));
    ASSIGN_OR_RETURN(a.kv_norm, Floats(s + "kv_norm.weight", {d}));
    ASSIGN_OR_RETURN(WeightMatrix o_a, Matrix(s + "wo_a.weight", g * r, c_.o_group_in()));
    ASSIGN_OR_RETURN(a.o_a_groups, SplitRows(o_a, g));
    ASSIGN_OR_RETURN(a.o_b_proj, Matrix(s + "wo_b.weight", dm, g * r));
    ASSIGN_OR_RETURN(a.sinks, Floats(s + "attn_sink", {c_.num_attention_heads}));
    if (type == AttentionType::kCompressedSparse) {
      const int64_t m = c_.compress_rate_csa, ci = c_.index_head_dim;
      ASSIGN_OR_RETURN(a.compressor, Compressor(s + "compressor.", d, 2 * d, m));
      IndexerWeights ix;
      ASSIGN_OR_RETURN(ix.compressor, Compressor(s + "indexer.compressor.", ci, 2 * ci, m));
      ASSIGN_OR_RETURN(ix.q_b_proj, Matrix(s + "indexer.wq_b.weight", c_.index_n_heads * ci, c_.q_lora_rank));
      ASSIGN_OR_RETURN(ix.weights_proj, Matrix(s + "indexer.weights_proj.weight", c_.index_n_heads, dm));
      a.indexer = std::move(ix);
    } else if (type == AttentionType::kHeavilyCompressed) {
      ASSIGN_OR_RETURN(a.compressor, Compressor(s + "compressor.", d, d, c_.compress_rate_hca));
    }
    return a;
  }

  // `parts` consecutive row blocks of `w` as matrices of their own. FP8 blocks that do
  // not start on a 128-row scale block are dequantized (exactly) to float32.
  absl::StatusOr<std::vector<WeightMatrix>> SplitRows(const WeightMatrix& w, int64_t parts) {
    std::vector<WeightMatrix> out;
    const int64_t rows = w.rows / parts;
    for (int64_t p = 0; p < parts; ++p) {
      WeightMatrix v = w;
      v.rows = rows;
      v.fp4_codes = nullptr;  // parts are read through the widening only
      v.fp4_scales = nullptr;
      const int64_t first = p * rows;
      if (w.dtype == DType::kF8E4M3) {
        if (rows % cpu::kFp8BlockSize == 0) {
          v.data = w.data + first * w.cols;
          v.block_scales = w.block_scales + (first / cpu::kFp8BlockSize) * w.scale_cols();
        } else {
          std::vector<float>& f = OwnF32(static_cast<size_t>(rows * w.cols));
          cpu::DequantizeRows(w, first, rows, f.data());
          v.dtype = DType::kF32;
          v.data = reinterpret_cast<const std::byte*>(f.data());
          v.block_scales = nullptr;
        }
      } else {
        v.data = w.data + first * w.cols * static_cast<int64_t>(DTypeSize(w.dtype));
      }
      out.push_back(v);
    }
    return out;
  }

  absl::StatusOr<ExpertWeights> Expert(const std::string& p, int64_t inter) {
    ExpertWeights e;
    ASSIGN_OR_RETURN(e.gate, Matrix(p + "w1.weight", inter, c_.hidden_size));
    ASSIGN_OR_RETURN(e.up, Matrix(p + "w3.weight", inter, c_.hidden_size));
    ASSIGN_OR_RETURN(e.down, Matrix(p + "w2.weight", c_.hidden_size, inter));
    return e;
  }

  // transformers' fused expert tensors, sliced per expert (float types only).
  absl::Status FusedExperts(int64_t layer, MoeWeights& moe) {
    const int64_t e = c_.n_routed_experts, inter = c_.moe_intermediate_size, dm = c_.hidden_size;
    FusedExpertNames names = v4::FusedExperts(w_.naming, layer).front();
    for (const FusedExpertNames& candidate : v4::FusedExperts(w_.naming, layer)) {
      if (ckpt_.Find(candidate.gate_up) != nullptr) {
        names = candidate;
        break;
      }
    }
    const TensorView* gate_up = ckpt_.Find(names.gate_up);
    const TensorView* down = ckpt_.Find(names.down);
    for (auto [t, name, shape] : {std::tuple{gate_up, names.gate_up, std::vector<int64_t>{e, 2 * inter, dm}},
                                  std::tuple{down, names.down, std::vector<int64_t>{e, dm, inter}}}) {
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint '", ckpt_.dir(), "' lacks tensor '", name,
                                                       "', expected with shape ", ShapeString(shape)));
      }
      if (t->shape != shape) return ShapeError(name, *t, shape);
      if (t->dtype != DType::kF32 && t->dtype != DType::kBF16) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", TypeName(t->dtype),
                                                       "; fused expert tensors must be F32 or BF16"));
      }
      Use(name, *t);
    }
    const int64_t es = static_cast<int64_t>(DTypeSize(gate_up->dtype));
    const int64_t ds = static_cast<int64_t>(DTypeSize(down->dtype));
    for (int64_t x = 0; x < e; ++x) {
      ExpertWeights ew;
      ew.gate = {.dtype = gate_up->dtype, .rows = inter, .cols = dm,
                 .data = gate_up->bytes.data() + x * 2 * inter * dm * es};
      ew.up = ew.gate;
      ew.up.data = ew.gate.data + inter * dm * es;
      ew.down = {.dtype = down->dtype, .rows = dm, .cols = inter, .data = down->bytes.data() + x * dm * inter * ds};
      moe.experts.push_back(ew);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const int32_t*> Tid2eid(const std::string& official) {
    const int64_t k = c_.num_experts_per_tok;
    ASSIGN_OR_RETURN(auto found, Require(official, {c_.vocab_size, k}));
    const auto& [t, name] = found;
    if (t->shape != std::vector<int64_t>{c_.vocab_size, k}) return ShapeError(name, *t, {c_.vocab_size, k});
    if (t->dtype != DType::kI64 && t->dtype != DType::kI32) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", TypeName(t->dtype),
                                                     "; tid2eid must be I64 or I32"));
    }
    out_.owned_i32_.push_back(std::make_unique<std::vector<int32_t>>(static_cast<size_t>(t->numel())));
    std::vector<int32_t>& v = *out_.owned_i32_.back();
    for (int64_t i = 0; i < t->numel(); ++i) {
      int64_t e;
      if (t->dtype == DType::kI64) {
        std::memcpy(&e, t->bytes.data() + 8 * i, 8);
      } else {
        int32_t e32;
        std::memcpy(&e32, t->bytes.data() + 4 * i, 4);
        e = e32;
      }
      if (e < 0 || e >= c_.n_routed_experts) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': token ", i / k, " routes to expert ", e,
                                                       ", outside [0, ", c_.n_routed_experts, ")"));
      }
      v[i] = static_cast<int32_t>(e);
    }
    return v.data();
  }

  absl::StatusOr<MoeWeights> Moe(const std::string& p, int64_t layer, MlpType type) {
    const int64_t e = c_.n_routed_experts, inter = c_.moe_intermediate_size;
    MoeWeights moe;
    const std::string f = p + "ffn.";
    ASSIGN_OR_RETURN(moe.router, Matrix(f + "gate.weight", e, c_.hidden_size));
    if (type == MlpType::kHashMoe) {
      ASSIGN_OR_RETURN(moe.tid2eid, Tid2eid(f + "gate.tid2eid"));
    } else {
      ASSIGN_OR_RETURN(moe.correction_bias, Floats(f + "gate.bias", {e}));
    }
    bool fused = layer >= 0 && w_.naming == TensorNaming::kTransformersModules;
    if (layer >= 0 && w_.naming == TensorNaming::kTransformersSaved && Lookup(f + "experts.0.w1.weight").first == nullptr) {
      for (const FusedExpertNames& candidate : v4::FusedExperts(w_.naming, layer)) {
        fused |= ckpt_.Find(candidate.gate_up) != nullptr;
      }
    }
    if (fused) {
      RETURN_IF_ERROR(FusedExperts(layer, moe));
    } else {
      for (int64_t x = 0; x < e; ++x) {
        ASSIGN_OR_RETURN(ExpertWeights ew, Expert(absl::StrCat(f, "experts.", x, "."), inter));
        moe.experts.push_back(ew);
      }
    }
    ASSIGN_OR_RETURN(moe.shared, Expert(f + "shared_experts.", inter));
    return moe;
  }

  // One decoder layer under `p` ("layers.3." or "mtp.0."); `layer` is -1 for MTP layers.
  absl::StatusOr<LayerWeights> Layer(const std::string& p, int64_t layer, AttentionType attention, MlpType mlp) {
    LayerWeights l;
    ASSIGN_OR_RETURN(l.attn_norm, Floats(p + "attn_norm.weight", {c_.hidden_size}));
    ASSIGN_OR_RETURN(l.ffn_norm, Floats(p + "ffn_norm.weight", {c_.hidden_size}));
    ASSIGN_OR_RETURN(l.attn_hc, HyperConnection(p, "attn"));
    ASSIGN_OR_RETURN(l.ffn_hc, HyperConnection(p, "ffn"));
    ASSIGN_OR_RETURN(l.attention, Attention(p, attention));
    ASSIGN_OR_RETURN(l.moe, Moe(p, layer, mlp));
    return l;
  }

  const DeepseekV4Config& c_;
  LoadedWeights& out_;
  const Checkpoint& ckpt_;
  ModelWeights& w_;
  std::set<std::string> used_;
};

absl::StatusOr<std::unique_ptr<LoadedWeights>> LoadedWeights::Load(const DeepseekV4Config& config,
                                                                   std::unique_ptr<Checkpoint> checkpoint) {
  auto loaded = std::unique_ptr<LoadedWeights>(new LoadedWeights());
  loaded->checkpoint_ = std::move(checkpoint);
  WeightResolver resolver(config, *loaded);
  RETURN_IF_ERROR(resolver.LoadAll());
  return loaded;
}

absl::StatusOr<std::unique_ptr<LoadedWeights>> LoadedWeights::Load(const DeepseekV4Config& config,
                                                                   const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(dir, AcceptedDTypes::kAll));
  return Load(config, std::move(checkpoint));
}

}  // namespace tandem::v4
