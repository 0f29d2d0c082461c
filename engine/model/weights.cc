#include "engine/model/weights.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"

namespace tandem {

// Resolves tensor names against the checkpoint, checking shapes and types.
class WeightLoader {
 public:
  WeightLoader(const ModelConfig& config, const ParallelLayout& layout, LoadedWeights& out)
      : c_(config), layout_(layout), out_(out), ckpt_(*out.checkpoint_) {}

  absl::Status LoadAll() {
    ModelWeights& w = out_.weights_;
    const int64_t hidden = c_.hidden_size;
    ASSIGN_OR_RETURN(w.embed, Matrix("model.embed_tokens.weight", c_.vocab_size, hidden));
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      ASSIGN_OR_RETURN(DecoderLayerWeights layer, Layer(i));
      w.layers.push_back(std::move(layer));
    }
    ASSIGN_OR_RETURN(w.final_norm, Vector("model.norm.weight", hidden));
    const bool tied = c_.tie_word_embeddings && ckpt_.Find("lm_head.weight") == nullptr;
    const std::string head = tied ? "model.embed_tokens.weight" : "lm_head.weight";
    w.lm_head_split = Split(head, c_.vocab_size);
    if (tied && !layout_.dense_split()) {
      w.lm_head = w.embed;
    } else {
      ASSIGN_OR_RETURN(w.lm_head, Matrix(head, c_.vocab_size, hidden, /*force_f32=*/false, &w.lm_head_split));
    }
    // MTP modules: loaded when the checkpoint has them (DeepSeek-V3 ships one; many
    // converted checkpoints drop it).
    for (int64_t j = 0; j < c_.num_nextn_predict_layers; ++j) {
      const int64_t idx = c_.num_hidden_layers + j;
      const std::string p = absl::StrCat("model.layers.", idx, ".");
      if (ckpt_.Find(p + "eh_proj.weight") == nullptr) continue;
      MtpLayerWeights m;
      m.layer_index = idx;
      ASSIGN_OR_RETURN(m.enorm, Vector(p + "enorm.weight", hidden));
      ASSIGN_OR_RETURN(m.hnorm, Vector(p + "hnorm.weight", hidden));
      ASSIGN_OR_RETURN(m.eh_proj, Matrix(p + "eh_proj.weight", hidden, 2 * hidden));
      ASSIGN_OR_RETURN(m.block, Layer(idx));
      ASSIGN_OR_RETURN(m.shared_head_norm, Vector(p + "shared_head.norm.weight", hidden));
      if (ckpt_.Find(p + "shared_head.head.weight") != nullptr) {
        ASSIGN_OR_RETURN(m.shared_head, Matrix(p + "shared_head.head.weight", c_.vocab_size, hidden));
      }
      if (ckpt_.Find(p + "embed_tokens.weight") != nullptr) {
        ASSIGN_OR_RETURN(m.embed, Matrix(p + "embed_tokens.weight", c_.vocab_size, hidden));
      }
      w.mtp_layers.push_back(std::move(m));
    }
    for (const auto& [name, view] : ckpt_.tensors()) {
      if (!used_.contains(name)) w.unused_tensors.push_back(name);
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<DecoderLayerWeights> Layer(int64_t i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const int64_t hidden = c_.hidden_size;
    const int64_t heads = c_.num_attention_heads;
    DecoderLayerWeights l;
    ASSIGN_OR_RETURN(l.input_norm, Vector(p + "input_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(l.post_attention_norm, Vector(p + "post_attention_layernorm.weight", hidden));
    AttentionWeights& a = l.attention;
    const std::string s = p + "self_attn.";
    if (c_.q_lora_rank) {
      ASSIGN_OR_RETURN(a.q_a_proj, Matrix(s + "q_a_proj.weight", *c_.q_lora_rank, hidden));
      ASSIGN_OR_RETURN(a.q_a_norm, Vector(s + "q_a_layernorm.weight", *c_.q_lora_rank));
      ASSIGN_OR_RETURN(a.q_b_proj, Matrix(s + "q_b_proj.weight", heads * c_.qk_head_dim(), *c_.q_lora_rank));
    } else {
      ASSIGN_OR_RETURN(a.q_proj, Matrix(s + "q_proj.weight", heads * c_.qk_head_dim(), hidden));
    }
    ASSIGN_OR_RETURN(a.kv_a_proj, Matrix(s + "kv_a_proj_with_mqa.weight", c_.kv_entry_dim(), hidden));
    ASSIGN_OR_RETURN(a.kv_a_norm, Vector(s + "kv_a_layernorm.weight", c_.kv_lora_rank));
    ASSIGN_OR_RETURN(a.kv_b_proj, Matrix(s + "kv_b_proj.weight", heads * (c_.qk_nope_head_dim + c_.v_head_dim),
                                         c_.kv_lora_rank));
    ASSIGN_OR_RETURN(a.o_proj, Matrix(s + "o_proj.weight", hidden, heads * c_.v_head_dim));

    const std::string m = p + "mlp.";
    if (c_.IsMoeLayer(i)) {
      MoeWeights moe;
      ASSIGN_OR_RETURN(moe.router, Matrix(m + "gate.weight", c_.n_routed_experts, hidden, /*force_f32=*/true));
      if (c_.topk_method == TopkMethod::kNoauxTc) {
        ASSIGN_OR_RETURN(moe.correction_bias, Vector(m + "gate.e_score_correction_bias", c_.n_routed_experts));
      }
      const auto [local_begin, local_end] = layout_.LocalExperts(c_.n_routed_experts);
      for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
        const bool local = e >= local_begin && e < local_end;
        ASSIGN_OR_RETURN(MlpWeights ex,
                         Mlp(absl::StrCat(m, "experts.", e, "."), c_.moe_intermediate_size, local ? kWhole : kNone));
        moe.experts.push_back(ex);
      }
      // Shared experts stay whole on every rank: each rank runs them over its own rows.
      if (c_.n_shared_experts > 0) {
        ASSIGN_OR_RETURN(moe.shared,
                         Mlp(m + "shared_experts.", c_.moe_intermediate_size * c_.n_shared_experts, kWhole));
      }
      l.moe = std::move(moe);
    } else {
      ASSIGN_OR_RETURN(l.mlp, Mlp(m, c_.intermediate_size, layout_.dense_split() ? kRankRows : kWhole));
    }
    return l;
  }

  // Which rows of an MLP's matrices this rank loads.
  enum MlpPart { kWhole, kNone, kRankRows };

  absl::StatusOr<MlpWeights> Mlp(const std::string& p, int64_t inter, MlpPart part) {
    MlpWeights w;
    const std::string gate = p + "gate_proj.weight", up = p + "up_proj.weight", down = p + "down_proj.weight";
    w.inter_split = RowSplit::Whole(inter);
    w.hidden_split = RowSplit::Whole(c_.hidden_size);
    if (part == kRankRows) {
      w.inter_split = Split(gate, inter);
      w.hidden_split = Split(down, c_.hidden_size);
    }
    // kNone: an empty range of rows (checked, not loaded).
    const RowSplit none{.rows = inter, .chunk = 0, .world = 1};
    const RowSplit none_down{.rows = c_.hidden_size, .chunk = 0, .world = 1};
    ASSIGN_OR_RETURN(w.gate, Matrix(gate, inter, c_.hidden_size, false, part == kNone ? &none : &w.inter_split));
    ASSIGN_OR_RETURN(w.up, Matrix(up, inter, c_.hidden_size, false, part == kNone ? &none : &w.inter_split));
    ASSIGN_OR_RETURN(w.down,
                     Matrix(down, c_.hidden_size, inter, false, part == kNone ? &none_down : &w.hidden_split));
    return w;
  }

  // The tensor-parallel split of tensor `name`'s `rows` rows (aligned for its stored type).
  RowSplit Split(const std::string& name, int64_t rows) const {
    if (!layout_.dense_split()) return RowSplit::Whole(rows);
    const TensorView* t = ckpt_.Find(name);
    return RowSplit::Make(rows, layout_.world, SplitAlignment(t != nullptr ? t->dtype : DType::kBF16));
  }

  // The rank of `split` whose rows Matrix loads: this rank's for a split, 0 (all rows, or
  // none for an empty chunk) otherwise.
  int SplitRank(const RowSplit& split) const { return split.world > 1 ? layout_.rank : 0; }

  absl::StatusOr<const TensorView*> Find(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* t = ckpt_.Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", ckpt_.dir(), "' lacks tensor '", name,
                                                     "' (expected shape ", ShapeString(shape), ")"));
    }
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ", ShapeString(t->shape),
                                                     ", but config.json implies ", ShapeString(shape)));
    }
    used_.insert(name);
    return t;
  }

  std::vector<float>& Own(size_t n) {
    out_.owned_.push_back(std::make_unique<std::vector<float>>(n));
    return *out_.owned_.back();
  }

  static void ToF32(const TensorView& t, float* dst) {
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      switch (t.dtype) {
        case DType::kF32: std::memcpy(&dst[i], t.bytes.data() + 4 * i, 4); break;
        case DType::kBF16: {
          uint16_t v;
          std::memcpy(&v, t.bytes.data() + 2 * i, 2);
          dst[i] = Bf16ToF32(v);
          break;
        }
        case DType::kF16: {
          uint16_t v;
          std::memcpy(&v, t.bytes.data() + 2 * i, 2);
          dst[i] = F16ToF32(v);
          break;
        }
        case DType::kF8E4M3: dst[i] = F8E4M3ToF32(static_cast<uint8_t>(t.bytes[i])); break;
        // Never in a checkpoint opened for V2/V3 (Checkpoint::Open refuses them there).
        case DType::kF8E8M0:
        case DType::kI8:
        case DType::kU8:
        case DType::kI32:
        case DType::kI64:
          TANDEM_CHECK(false) << "tensor of type " << DTypeName(t.dtype);
      }
    }
  }

  absl::StatusOr<const float*> Vector(const std::string& name, int64_t n) {
    ASSIGN_OR_RETURN(const TensorView* t, Find(name, {n}));
    out_.weights_.weight_bytes += t->bytes.size();
    if (t->dtype == DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is F8_E4M3; vectors must be F32, BF16 or F16"));
    }
    std::vector<float>& v = Own(static_cast<size_t>(n));
    ToF32(*t, v.data());
    return v.data();
  }

  // Tensor `name`, [rows, cols], or only the rows of `split` this rank holds (SplitRank):
  // a view of the mapped checkpoint in its stored type, or a float32 copy of those rows
  // for F16 and when forced. An empty matrix (rows 0, no data) for an empty range.
  absl::StatusOr<WeightMatrix> Matrix(const std::string& name, int64_t rows, int64_t cols, bool force_f32 = false,
                                      const RowSplit* split = nullptr) {
    const int64_t begin = split != nullptr ? split->begin(SplitRank(*split)) : 0;
    const int64_t n = split != nullptr ? split->size(SplitRank(*split)) : rows;
    ASSIGN_OR_RETURN(const WeightMatrix whole, View(name, rows, cols, /*with_scales=*/n > 0));
    if (n == 0) return WeightMatrix{.dtype = whole.dtype, .rows = 0, .cols = cols};
    if (whole.dtype == DType::kF8E4M3 && begin % cpu::kFp8BlockSize != 0) {
      return absl::InvalidArgumentError(absl::StrCat("FP8 tensor '", name, "' cannot be split at row ", begin));
    }
    out_.weights_.weight_bytes += static_cast<uint64_t>(n * cols) * DTypeSize(whole.dtype);
    WeightMatrix w = whole;
    w.rows = n;
    w.data = whole.data + begin * cols * static_cast<int64_t>(DTypeSize(whole.dtype));
    if (whole.block_scales != nullptr) w.block_scales += (begin / cpu::kFp8BlockSize) * whole.scale_cols();
    if (force_f32 || w.dtype == DType::kF16) {
      std::vector<float>& f = Own(static_cast<size_t>(n * cols));
      cpu::DequantizeRows(whole, begin, n, f.data());
      w = WeightMatrix{.dtype = DType::kF32, .rows = n, .cols = cols,
                       .data = reinterpret_cast<const std::byte*>(f.data())};
    }
    return w;
  }

  // The whole tensor in its stored type, FP8 with its scales as float32 (checked only,
  // without `with_scales`).
  absl::StatusOr<WeightMatrix> View(const std::string& name, int64_t rows, int64_t cols, bool with_scales) {
    ASSIGN_OR_RETURN(const TensorView* t, Find(name, {rows, cols}));
    WeightMatrix w;
    w.rows = rows;
    w.cols = cols;
    w.dtype = t->dtype;
    w.data = t->bytes.data();
    if (t->dtype == DType::kF8E4M3) {
      const std::string scale_name = name + "_scale_inv";
      const std::vector<int64_t> scale_shape = {(rows + cpu::kFp8BlockSize - 1) / cpu::kFp8BlockSize,
                                                (cols + cpu::kFp8BlockSize - 1) / cpu::kFp8BlockSize};
      absl::StatusOr<const TensorView*> scales = Find(scale_name, scale_shape);
      if (!scales.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("FP8 tensor '", name, "' needs its block scales: ",
                                                       scales.status().message()));
      }
      if ((*scales)->dtype == DType::kF8E4M3) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", scale_name, "' must be F32 or BF16"));
      }
      if (!with_scales) return w;
      out_.weights_.weight_bytes += (*scales)->bytes.size();
      std::vector<float>& s = Own(static_cast<size_t>((*scales)->numel()));
      ToF32(**scales, s.data());
      w.block_scales = s.data();
    }
    return w;
  }

  const ModelConfig& c_;
  const ParallelLayout& layout_;
  LoadedWeights& out_;
  const Checkpoint& ckpt_;
  std::set<std::string> used_;
};

absl::StatusOr<std::unique_ptr<LoadedWeights>> LoadedWeights::Load(const ModelConfig& config,
                                                                   std::unique_ptr<Checkpoint> checkpoint,
                                                                   const ParallelLayout& layout) {
  auto loaded = std::unique_ptr<LoadedWeights>(new LoadedWeights());
  loaded->checkpoint_ = std::move(checkpoint);
  WeightLoader loader(config, layout, *loaded);
  RETURN_IF_ERROR(loader.LoadAll());
  return loaded;
}

}  // namespace tandem
