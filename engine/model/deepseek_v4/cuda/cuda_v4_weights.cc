#include "engine/model/deepseek_v4/cuda/cuda_v4_weights.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"

namespace tandem::v4::cuda_v4 {
namespace {

using cuda_model::DeviceBuffer;

class Uploader {
 public:
  explicit Uploader(CudaV4Weights* out) : out_(out) {}

  absl::StatusOr<const void*> Bytes(const void* host, size_t bytes, const char* what) {
    DeviceBuffer b;
    RETURN_IF_ERROR(b.Allocate(bytes, what));
    TANDEM_CUDA_RETURN(cudaMemcpy(b.get(), host, bytes, cudaMemcpyHostToDevice), what);
    out_->bytes += bytes;
    const void* p = b.get();
    out_->buffers.push_back(std::move(b));
    return p;
  }
  absl::StatusOr<const float*> Floats(const float* host, int64_t n, const char* what) {
    if (host == nullptr) return static_cast<const float*>(nullptr);
    ASSIGN_OR_RETURN(const void* p, Bytes(host, static_cast<size_t>(n) * sizeof(float), what));
    return static_cast<const float*>(p);
  }
  // The matrices stacked by rows (equal cols): FP8 where every part is FP8 with whole
  // 128-row scale blocks (but the last) and the GEMV's k a multiple of 16; FP4 where every
  // part keeps its stored FP4 form (WeightMatrix::fp4_codes) and k is a multiple of 32;
  // bf16 where every part is stored bf16 and k is a multiple of 8; else each widened to
  // float32 as the CPU does.
  absl::StatusOr<DeviceMatrix> Stack(const std::vector<const WeightMatrix*>& parts, const char* what,
                                     bool narrow_allowed = true) {
    int64_t rows = 0, cols = -1;
    bool fp8 = narrow_allowed, fp4 = narrow_allowed, bf16 = narrow_allowed;
    for (size_t i = 0; i < parts.size(); ++i) {
      const WeightMatrix* m = parts[i];
      if (cols >= 0 && m->cols != cols) return absl::InternalError(absl::StrCat(what, ": stacked widths differ"));
      cols = m->cols;
      rows += m->rows;
      fp8 = fp8 && m->dtype == DType::kF8E4M3 && m->block_scales != nullptr && m->cols % 16 == 0 &&
            (i + 1 == parts.size() || m->rows % cpu::kFp8BlockSize == 0);
      fp4 = fp4 && m->fp4_codes != nullptr && m->fp4_scales != nullptr && m->cols % 32 == 0;
      bf16 = bf16 && m->dtype == DType::kBF16 && m->cols % 8 == 0;
    }
    if (fp8) return StackFp8(parts, rows, cols, what);
    if (fp4) return StackFp4(parts, rows, cols, what);
    if (bf16) return StackBf16(parts, rows, cols, what);
    std::vector<float> host(static_cast<size_t>(rows * cols));
    int64_t at = 0;
    for (const WeightMatrix* m : parts) {
      cpu::DequantizeRows(*m, 0, m->rows, &host[static_cast<size_t>(at * cols)]);
      at += m->rows;
    }
    ASSIGN_OR_RETURN(const float* p, Floats(host.data(), rows * cols, what));
    return DeviceMatrix{.data = p, .rows = rows, .cols = cols};
  }
  absl::StatusOr<DeviceMatrix> Matrix(const WeightMatrix& m, const char* what, bool narrow_allowed = true) {
    return Stack({&m}, what, narrow_allowed);
  }

  absl::StatusOr<HyperSite> Hyper(const WeightMatrix& fn, const float* base, const float* scale, int64_t base_n,
                                  int64_t scale_n) {
    HyperSite s;
    ASSIGN_OR_RETURN(s.fn, Matrix(fn, "an mHC projection"));
    ASSIGN_OR_RETURN(s.base, Floats(base, base_n, "an mHC base"));
    ASSIGN_OR_RETURN(s.scale, Floats(scale, scale_n, "an mHC scale"));
    return s;
  }

  absl::StatusOr<ExpertMatrices> Expert(const ExpertWeights& e) {
    ExpertMatrices m;
    ASSIGN_OR_RETURN(m.gate_up, Stack({&e.gate, &e.up}, "an expert's gate and up projections"));
    ASSIGN_OR_RETURN(m.down, Matrix(e.down, "an expert's down projection"));
    return m;
  }

 private:
  absl::StatusOr<DeviceMatrix> StackFp8(const std::vector<const WeightMatrix*>& parts, int64_t rows, int64_t cols,
                                        const char* what) {
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    std::vector<float> scales;
    int64_t at = 0;
    for (const WeightMatrix* m : parts) {
      std::memcpy(&codes[static_cast<size_t>(at * cols)], m->data, static_cast<size_t>(m->rows * cols));
      const int64_t n = (m->rows + cpu::kFp8BlockSize - 1) / cpu::kFp8BlockSize * m->scale_cols();
      scales.insert(scales.end(), m->block_scales, m->block_scales + n);
      at += m->rows;
    }
    ASSIGN_OR_RETURN(const void* c, Bytes(codes.data(), codes.size(), what));
    ASSIGN_OR_RETURN(const float* s, Floats(scales.data(), static_cast<int64_t>(scales.size()), what));
    ++out_->fp8_matrices;
    out_->max_narrow_elements = std::max(out_->max_narrow_elements, rows * cols);
    out_->max_fp8_cols = std::max(out_->max_fp8_cols, cols);
    return DeviceMatrix{.codes = static_cast<const uint8_t*>(c), .scales = s,
                        .format = cuda::QuantizedWeight::kFp8Block128, .rows = rows, .cols = cols};
  }
  absl::StatusOr<DeviceMatrix> StackFp4(const std::vector<const WeightMatrix*>& parts, int64_t rows, int64_t cols,
                                        const char* what) {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    codes.reserve(static_cast<size_t>(rows * cols / 2));
    scales.reserve(static_cast<size_t>(rows * cols / 32));
    for (const WeightMatrix* m : parts) {
      codes.insert(codes.end(), m->fp4_codes, m->fp4_codes + m->rows * cols / 2);
      scales.insert(scales.end(), m->fp4_scales, m->fp4_scales + m->rows * cols / 32);
    }
    ++out_->fp4_matrices;
    out_->max_narrow_elements = std::max(out_->max_narrow_elements, rows * cols);
    // Plain FP4, not the tensor-core GEMV's tiles (kFp4Tiled): at one row a problem, which
    // is what the routed experts run, the tiled form measured slower on an H100 (0.36 vs
    // 0.41 of the copy, docs/performance.md).
    ASSIGN_OR_RETURN(const void* c, Bytes(codes.data(), codes.size(), what));
    ASSIGN_OR_RETURN(const float* s, Floats(scales.data(), static_cast<int64_t>(scales.size()), what));
    return DeviceMatrix{.codes = static_cast<const uint8_t*>(c), .scales = s,
                        .format = cuda::QuantizedWeight::kFp4Group32, .rows = rows, .cols = cols};
  }

  absl::StatusOr<DeviceMatrix> StackBf16(const std::vector<const WeightMatrix*>& parts, int64_t rows, int64_t cols,
                                         const char* what) {
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols * 2));
    int64_t at = 0;
    for (const WeightMatrix* m : parts) {
      std::memcpy(&codes[static_cast<size_t>(at * cols * 2)], m->data, static_cast<size_t>(m->rows * cols * 2));
      at += m->rows;
    }
    ASSIGN_OR_RETURN(const void* c, Bytes(codes.data(), codes.size(), what));
    ++out_->bf16_matrices;
    out_->max_narrow_elements = std::max(out_->max_narrow_elements, rows * cols);
    return DeviceMatrix{.codes = static_cast<const uint8_t*>(c), .format = cuda::QuantizedWeight::kBf16,
                        .rows = rows, .cols = cols};
  }

  CudaV4Weights* out_;
};

// The routed GEMV's tables, where every expert's gate_up is narrow in one format and every
// down in one (the two may differ: FP4 tiles need 64 columns).
absl::Status ExpertTables(CudaV4Layer& l, Uploader& up) {
  if (l.experts.empty() || !l.experts[0].gate_up.narrow() || !l.experts[0].down.narrow()) return absl::OkStatus();
  const cuda::QuantizedWeight gate_up_format = l.experts[0].gate_up.format, down_format = l.experts[0].down.format;
  std::vector<cuda::QuantizedMatrixRef> gate_up, down;
  for (const ExpertMatrices& e : l.experts) {
    if (!e.gate_up.narrow() || e.gate_up.format != gate_up_format || !e.down.narrow() ||
        e.down.format != down_format) {
      return absl::OkStatus();
    }
    gate_up.push_back({.w = e.gate_up.codes, .scales = e.gate_up.scales});
    down.push_back({.w = e.down.codes, .scales = e.down.scales});
  }
  const size_t bytes = gate_up.size() * sizeof(cuda::QuantizedMatrixRef);
  ASSIGN_OR_RETURN(const void* g, up.Bytes(gate_up.data(), bytes, "the experts' table"));
  ASSIGN_OR_RETURN(const void* d, up.Bytes(down.data(), bytes, "the experts' table"));
  l.gate_up_table = static_cast<const cuda::QuantizedMatrixRef*>(g);
  l.down_table = static_cast<const cuda::QuantizedMatrixRef*>(d);
  l.gate_up_format = gate_up_format;
  l.down_format = down_format;
  return absl::OkStatus();
}

absl::StatusOr<CudaV4Layer> Layer(const DeepseekV4Config& c, AttentionType type, const LayerWeights& lw,
                                  Uploader& up) {
  const int64_t n = c.hc_mult, mix = (2 + n) * n;
  CudaV4Layer l;
  ASSIGN_OR_RETURN(l.attn_norm, up.Floats(lw.attn_norm, c.hidden_size, "a layer norm"));
  ASSIGN_OR_RETURN(l.ffn_norm, up.Floats(lw.ffn_norm, c.hidden_size, "a layer norm"));
  ASSIGN_OR_RETURN(l.attn_hc, up.Hyper(lw.attn_hc.fn, lw.attn_hc.base, lw.attn_hc.scale, mix, 3));
  ASSIGN_OR_RETURN(l.ffn_hc, up.Hyper(lw.ffn_hc.fn, lw.ffn_hc.base, lw.ffn_hc.scale, mix, 3));

  const AttentionWeights& a = lw.attention;
  XProjColumns& cols = l.x_cols;
  cols.q_a = 0;
  cols.kv = a.q_a_proj.rows;
  int64_t width = cols.kv + a.kv_proj.rows;
  ASSIGN_OR_RETURN(DeviceMatrix queries, up.Stack({&a.q_a_proj, &a.kv_proj}, "the input projections"));
  l.x_proj.push_back({queries, 0});
  std::vector<const WeightMatrix*> compressors;
  if (type != AttentionType::kSliding) {
    cols.compressor = width;
    compressors.push_back(&a.compressor->kv_proj);
    compressors.push_back(&a.compressor->gate_proj);
    width += a.compressor->kv_proj.rows + a.compressor->gate_proj.rows;
  }
  if (type == AttentionType::kCompressedSparse) {
    cols.indexer_compressor = width;
    compressors.push_back(&a.indexer->compressor.kv_proj);
    compressors.push_back(&a.indexer->compressor.gate_proj);
    width += a.indexer->compressor.kv_proj.rows + a.indexer->compressor.gate_proj.rows;
  }
  if (!compressors.empty()) {
    ASSIGN_OR_RETURN(DeviceMatrix m, up.Stack(compressors, "the compressors' projections"));
    l.x_proj.push_back({m, cols.compressor});
  }
  cols.width = width;

  ASSIGN_OR_RETURN(l.q_a_norm, up.Floats(a.q_a_norm, c.q_lora_rank, "q_a_norm"));
  ASSIGN_OR_RETURN(l.kv_norm, up.Floats(a.kv_norm, c.head_dim, "kv_norm"));
  ASSIGN_OR_RETURN(l.q_b, up.Matrix(a.q_b_proj, "q_b_proj"));
  if (type == AttentionType::kCompressedSparse) {
    ASSIGN_OR_RETURN(l.index_q_b, up.Matrix(a.indexer->q_b_proj, "the indexer's q_b_proj"));
    ASSIGN_OR_RETURN(l.index_weights, up.Matrix(a.indexer->weights_proj, "the indexer's weights_proj"));
  }
  bool o_a_fp8 = true;
  for (const WeightMatrix& g : a.o_a_groups) o_a_fp8 = o_a_fp8 && g.dtype == DType::kF8E4M3 && g.cols % 16 == 0;
  if (o_a_fp8) {
    std::vector<cuda::QuantizedMatrixRef> table;
    for (const WeightMatrix& g : a.o_a_groups) {
      ASSIGN_OR_RETURN(DeviceMatrix m, up.Matrix(g, "o_a_proj"));
      l.o_a_groups.push_back(m);
      table.push_back({.w = m.codes, .scales = m.scales});
    }
    bool all_fp8 = !l.o_a_groups.empty() && l.o_a_groups.size() <= 64;
    for (const DeviceMatrix& m : l.o_a_groups) all_fp8 = all_fp8 && m.narrow() && m.format == cuda::QuantizedWeight::kFp8Block128;
    if (all_fp8) {
      ASSIGN_OR_RETURN(const void* t, up.Bytes(table.data(), table.size() * sizeof(table[0]), "o_a_proj's table"));
      l.o_a_table = static_cast<const cuda::QuantizedMatrixRef*>(t);
    }
  } else {
    const int64_t r = c.o_lora_rank, in = c.o_group_in();
    std::vector<float> o_a(static_cast<size_t>(c.o_groups * r * in));
    for (int64_t g = 0; g < c.o_groups; ++g) {
      cpu::DequantizeRows(a.o_a_groups[static_cast<size_t>(g)], 0, r, &o_a[static_cast<size_t>(g * r * in)]);
    }
    ASSIGN_OR_RETURN(const float* p, up.Floats(o_a.data(), c.o_groups * r * in, "o_a_proj"));
    l.o_a = {.data = p, .rows = c.o_groups * r, .cols = in};
  }
  ASSIGN_OR_RETURN(l.o_b, up.Matrix(a.o_b_proj, "o_b_proj"));
  ASSIGN_OR_RETURN(l.sinks, up.Floats(a.sinks, c.num_attention_heads, "attention sinks"));
  auto compressor = [&](const CompressorWeights& w, int64_t rate, int64_t proj, int64_t entry,
                        CompressorParams* out) -> absl::Status {
    ASSIGN_OR_RETURN(out->position_bias, up.Floats(w.position_bias, rate * proj, "a compressor's position bias"));
    ASSIGN_OR_RETURN(out->norm, up.Floats(w.norm, entry, "a compressor's norm"));
    return absl::OkStatus();
  };
  if (type == AttentionType::kCompressedSparse) {
    RETURN_IF_ERROR(compressor(*a.compressor, c.compress_rate_csa, 2 * c.head_dim, c.head_dim, &l.compressor));
    RETURN_IF_ERROR(compressor(a.indexer->compressor, c.compress_rate_csa, 2 * c.index_head_dim, c.index_head_dim,
                               &l.indexer_compressor));
  } else if (type == AttentionType::kHeavilyCompressed) {
    RETURN_IF_ERROR(compressor(*a.compressor, c.compress_rate_hca, c.head_dim, c.head_dim, &l.compressor));
  }

  const MoeWeights& m = lw.moe;
  ASSIGN_OR_RETURN(l.router, up.Matrix(m.router, "the router"));
  ASSIGN_OR_RETURN(l.correction_bias, up.Floats(m.correction_bias, c.n_routed_experts, "the router's bias"));
  if (m.tid2eid != nullptr) {
    ASSIGN_OR_RETURN(const void* p, up.Bytes(m.tid2eid, static_cast<size_t>(c.vocab_size * c.num_experts_per_tok) *
                                                            sizeof(int32_t),
                                             "tid2eid"));
    l.tid2eid = static_cast<const int32_t*>(p);
  }
  for (const ExpertWeights& e : m.experts) {
    ASSIGN_OR_RETURN(ExpertMatrices em, up.Expert(e));
    l.experts.push_back(em);
  }
  RETURN_IF_ERROR(ExpertTables(l, up));
  ASSIGN_OR_RETURN(l.shared, up.Expert(m.shared));
  return l;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaV4Weights>> UploadV4Weights(const DeepseekV4Config& c, const ModelWeights& w) {
  auto out = std::make_unique<CudaV4Weights>();
  Uploader up(out.get());
  // Rows of the embedding are gathered as float32.
  ASSIGN_OR_RETURN(out->embed, up.Matrix(w.embed, "the embedding", /*narrow_allowed=*/false));
  ASSIGN_OR_RETURN(out->head, up.Matrix(w.head, "the LM head"));
  ASSIGN_OR_RETURN(out->norm, up.Floats(w.norm, c.hidden_size, "the final norm"));
  {
    std::vector<int32_t> iota(64);
    for (int32_t i = 0; i < 64; ++i) iota[static_cast<size_t>(i)] = i;
    ASSIGN_OR_RETURN(const void* p, up.Bytes(iota.data(), iota.size() * sizeof(int32_t), "group ids"));
    out->iota = static_cast<const int32_t*>(p);
  }
  ASSIGN_OR_RETURN(out->hc_head, up.Hyper(w.hc_head.fn, w.hc_head.base, w.hc_head.scale, c.hc_mult, 1));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(CudaV4Layer layer, Layer(c, c.layer_types[l], w.layers[static_cast<size_t>(l)], up));
    out->layers.push_back(std::move(layer));
  }
  out->experts_routed_on_device = std::all_of(out->layers.begin(), out->layers.end(),
                                              [](const CudaV4Layer& l) { return l.down_table != nullptr; });
  return out;
}

}  // namespace tandem::v4::cuda_v4
