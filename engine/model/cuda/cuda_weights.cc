#include "engine/model/cuda/cuda_weights.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/generator_random.h"
#include "engine/model/mtp_test_model.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/mla_decode_attention.h"
#include "kernels/cuda/random_init.h"
#include "xxhash.h"

namespace tandem::cuda_model {
namespace {

using cuda::RandomInit;

// Where Builder::Fill leaves a tensor's FP8 form: codes [rows][cols], then its block scales.
struct Fp8Dest {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
};

class Builder {
 public:
  Builder(const ModelConfig& c, const ModelWeights* host, uint64_t seed, cudaStream_t stream, bool mtp,
          const MtpTestWeights* test, bool fp8_forms)
      : c_(c), host_(host), seed_(seed), stream_(stream), mtp_(mtp), test_(host == nullptr ? test : nullptr),
        fp8_forms_(fp8_forms),
        generate_fp8_(host == nullptr && test_ == nullptr && c.fp8_block_quantized),
        out_(std::make_unique<CudaModelWeights>()) {}

  absl::StatusOr<std::unique_ptr<CudaModelWeights>> Build() {
    const int64_t hidden = c_.hidden_size;
    if (c_.vocab_size <= 0) return absl::InvalidArgumentError("config.json: vocab_size must be set");
    ASSIGN_OR_RETURN(out_->embed, NewMatrix(c_.vocab_size, hidden, "embedding"));
    RETURN_IF_ERROR(Fill("model.embed_tokens.weight", host_ ? &host_->embed : nullptr, c_.vocab_size, hidden,
                         RandomInit::kEmbedding, out_->embed.data));
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) {
      ASSIGN_OR_RETURN(CudaLayerWeights layer, Layer(i, host_ ? &host_->layers[i] : nullptr));
      out_->layers.push_back(layer);
    }
    ASSIGN_OR_RETURN(out_->final_norm, Vector("model.norm.weight", host_ ? host_->final_norm : nullptr, hidden,
                                              RandomInit::kNorm, /*stored_bf16=*/true));
    const bool tied = host_ != nullptr ? host_->lm_head.data == host_->embed.data : c_.tie_word_embeddings;
    if (tied) {
      out_->lm_head = out_->embed;
    } else {
      ASSIGN_OR_RETURN(out_->lm_head, NewMatrix(c_.vocab_size, hidden, "lm_head"));
      RETURN_IF_ERROR(Fill("lm_head.weight", host_ ? &host_->lm_head : nullptr, c_.vocab_size, hidden,
                           RandomInit::kLinear, out_->lm_head.data));
    }
    if (mtp_) RETURN_IF_ERROR(Mtp());
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "uploading weights");
    temp_[0].Reset();
    temp_[1].Reset();
    raw_.Reset();
    scales_.Reset();
    return std::move(out_);
  }

 private:
  // The first MTP layer (model.layers.{num_hidden_layers}.*, as make-model and DeepSeek-V3
  // write it): its decoder block after the decoder layers, the rest in out_->mtp.
  absl::Status Mtp() {
    const int64_t hidden = c_.hidden_size, index = c_.num_hidden_layers;
    const MtpLayerWeights* hm = nullptr;
    if (host_ != nullptr) {
      if (host_->mtp_layers.empty()) {
        return absl::FailedPreconditionError("speculative decoding needs the checkpoint's MTP layer; it has none");
      }
      hm = &host_->mtp_layers.front();
    } else if (c_.num_nextn_predict_layers < 1) {
      return absl::FailedPreconditionError(
          "speculative decoding needs the checkpoint's MTP layer: config.json's num_nextn_predict_layers is 0");
    }
    const std::string p = absl::StrCat("model.layers.", index, ".");
    ASSIGN_OR_RETURN(CudaLayerWeights block, Layer(index, hm ? &hm->block : nullptr));
    out_->layers.push_back(block);
    CudaMtpWeights m;
    ASSIGN_OR_RETURN(m.enorm, Vector(p + "enorm.weight", hm ? hm->enorm : nullptr, hidden, RandomInit::kNorm, true));
    ASSIGN_OR_RETURN(m.hnorm, Vector(p + "hnorm.weight", hm ? hm->hnorm : nullptr, hidden, RandomInit::kNorm, true));
    ASSIGN_OR_RETURN(m.eh_proj, NewMatrix(hidden, 2 * hidden, "eh_proj"));
    RETURN_IF_ERROR(Fill(p + "eh_proj.weight", hm ? &hm->eh_proj : nullptr, hidden, 2 * hidden, RandomInit::kLinear,
                         m.eh_proj.data));
    ASSIGN_OR_RETURN(m.shared_head_norm, Vector(p + "shared_head.norm.weight", hm ? hm->shared_head_norm : nullptr,
                                                hidden, RandomInit::kNorm, true));
    // make-model writes neither (they share the main model's) unless it constructs a test
    // model, which the GPU does not generate.
    m.shared_head = out_->lm_head;
    if (hm != nullptr && hm->shared_head.valid()) {
      ASSIGN_OR_RETURN(m.shared_head, NewMatrix(c_.vocab_size, hidden, "MTP shared head"));
      RETURN_IF_ERROR(Fill(p + "shared_head.head.weight", &hm->shared_head, c_.vocab_size, hidden,
                           RandomInit::kLinear, m.shared_head.data));
    }
    m.embed = out_->embed;
    if (test_ != nullptr) {  // the construction's own MTP embedding (good and bad tokens)
      ASSIGN_OR_RETURN(m.embed, NewMatrix(c_.vocab_size, hidden, "MTP embedding"));
      RETURN_IF_ERROR(Fill(p + "embed_tokens.weight", nullptr, c_.vocab_size, hidden, RandomInit::kEmbedding,
                           m.embed.data));
    } else if (hm != nullptr && hm->embed.valid()) {
      ASSIGN_OR_RETURN(m.embed, NewMatrix(c_.vocab_size, hidden, "MTP embedding"));
      RETURN_IF_ERROR(Fill(p + "embed_tokens.weight", &hm->embed, c_.vocab_size, hidden, RandomInit::kEmbedding,
                           m.embed.data));
    }
    out_->mtp = m;
    return absl::OkStatus();
  }

  absl::StatusOr<CudaLayerWeights> Layer(int64_t i, const DecoderLayerWeights* hl) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const int64_t hidden = c_.hidden_size, heads = c_.num_attention_heads;
    const int64_t rank = c_.kv_lora_rank, rope = c_.qk_rope_head_dim, nope = c_.qk_nope_head_dim, v = c_.v_head_dim;
    CudaLayerWeights l;
    ASSIGN_OR_RETURN(l.input_norm, Vector(p + "input_layernorm.weight", hl ? hl->input_norm : nullptr, hidden,
                                          RandomInit::kNorm, true));
    ASSIGN_OR_RETURN(l.post_attention_norm, Vector(p + "post_attention_layernorm.weight",
                                                   hl ? hl->post_attention_norm : nullptr, hidden, RandomInit::kNorm,
                                                   true));
    const std::string s = p + "self_attn.";
    const AttentionWeights* ha = hl ? &hl->attention : nullptr;
    CudaAttentionWeights& a = l.attention;
    const int64_t q_rows = c_.q_lora_rank ? *c_.q_lora_rank : heads * c_.qk_head_dim();
    ASSIGN_OR_RETURN(a.qkv_a, NewMatrix(q_rows + rank + rope, hidden, "q/kv_a projection"));
    const std::string q_name = s + (c_.q_lora_rank ? "q_a_proj.weight" : "q_proj.weight");
    const WeightMatrix* q_host = ha ? (c_.q_lora_rank ? &ha->q_a_proj : &ha->q_proj) : nullptr;
    const std::string kv_a_name = s + "kv_a_proj_with_mqa.weight";
    std::vector<Fp8Dest> qkv_fp8;
    ASSIGN_OR_RETURN(a.qkv_a_fp8, StackFp8({{q_name, q_host, q_rows}, {kv_a_name, ha ? &ha->kv_a_proj : nullptr,
                                                                       rank + rope}},
                                           hidden, &qkv_fp8));
    RETURN_IF_ERROR(Fill(q_name, q_host, q_rows, hidden, RandomInit::kLinear, a.qkv_a.data, Fp8Or(qkv_fp8[0])));
    if (c_.q_lora_rank) {
      const int64_t qr = *c_.q_lora_rank;
      ASSIGN_OR_RETURN(a.q_a_norm, Vector(s + "q_a_layernorm.weight", ha ? ha->q_a_norm : nullptr, qr,
                                          RandomInit::kNorm, true));
      ASSIGN_OR_RETURN(a.q_b, NewMatrix(heads * c_.qk_head_dim(), qr, "q_b_proj"));
      std::vector<Fp8Dest> q_b_fp8;
      ASSIGN_OR_RETURN(a.q_b_fp8, StackFp8({{s + "q_b_proj.weight", ha ? &ha->q_b_proj : nullptr,
                                             heads * c_.qk_head_dim()}},
                                           qr, &q_b_fp8));
      RETURN_IF_ERROR(Fill(s + "q_b_proj.weight", ha ? &ha->q_b_proj : nullptr, heads * c_.qk_head_dim(), qr,
                           RandomInit::kLinear, a.q_b.data, Fp8Or(q_b_fp8[0])));
    }
    RETURN_IF_ERROR(Fill(kv_a_name, ha ? &ha->kv_a_proj : nullptr, rank + rope, hidden, RandomInit::kLinear,
                         a.qkv_a.data + q_rows * hidden, Fp8Or(qkv_fp8[1])));
    ASSIGN_OR_RETURN(a.kv_a_norm, Vector(s + "kv_a_layernorm.weight", ha ? ha->kv_a_norm : nullptr, rank,
                                         RandomInit::kNorm, true));
    ASSIGN_OR_RETURN(a.kv_b, NewMatrix(heads * (nope + v), rank, "kv_b_proj"));
    RETURN_IF_ERROR(Fill(s + "kv_b_proj.weight", ha ? &ha->kv_b_proj : nullptr, heads * (nope + v), rank,
                         RandomInit::kLinear, a.kv_b.data));
    ASSIGN_OR_RETURN(a.kv_b_split, NewMatrix(heads * (nope + v), rank, "kv_b_proj (split)"));
    const size_t row_bytes = static_cast<size_t>(rank) * 2;
    TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(a.kv_b_split.data, nope * row_bytes, a.kv_b.data, (nope + v) * row_bytes,
                                         nope * row_bytes, heads, cudaMemcpyDeviceToDevice, stream_),
                       "splitting kv_b_proj");
    TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(a.kv_b_split.data + heads * nope * rank, v * row_bytes,
                                         a.kv_b.data + nope * rank, (nope + v) * row_bytes, v * row_bytes, heads,
                                         cudaMemcpyDeviceToDevice, stream_),
                       "splitting kv_b_proj");
    ASSIGN_OR_RETURN(float* w_uv, Alloc<float>(heads * v * rank, "W_UV"));
    for (int64_t h = 0; h < heads; ++h) {
      TANDEM_CUDA_RETURN(cuda::ConvertBf16ToF32({.src = a.kv_b.data + (h * (nope + v) + nope) * rank, .src_stride = rank,
                                                 .dst = w_uv + h * v * rank, .dst_stride = rank, .rows = v,
                                                 .cols = rank},
                                                stream_),
                         "converting W_UV");
    }
    a.w_uv = w_uv;
    if (heads <= kSplitQueryMaxHeads && cuda::MlaDecodeSplitsQueries(static_cast<int>(rank), static_cast<int>(rope))) {
      ASSIGN_OR_RETURN(float* w_uk, Alloc<float>(heads * nope * rank, "W_UK"));
      for (int64_t h = 0; h < heads; ++h) {
        TANDEM_CUDA_RETURN(cuda::ConvertBf16ToF32({.src = a.kv_b.data + h * (nope + v) * rank, .src_stride = rank,
                                                   .dst = w_uk + h * nope * rank, .dst_stride = rank, .rows = nope,
                                                   .cols = rank},
                                                  stream_),
                           "converting W_UK");
      }
      a.w_uk = w_uk;
    }
    ASSIGN_OR_RETURN(a.o_proj, NewMatrix(hidden, heads * v, "o_proj"));
    std::vector<Fp8Dest> o_fp8;
    ASSIGN_OR_RETURN(a.o_proj_fp8, StackFp8({{s + "o_proj.weight", ha ? &ha->o_proj : nullptr, hidden}}, heads * v,
                                            &o_fp8));
    RETURN_IF_ERROR(Fill(s + "o_proj.weight", ha ? &ha->o_proj : nullptr, hidden, heads * v, RandomInit::kLinear,
                         a.o_proj.data, Fp8Or(o_fp8[0])));

    const std::string m = p + "mlp.";
    if (c_.IsMoeLayer(i)) {
      const MoeWeights* hm = hl ? &*hl->moe : nullptr;
      const int64_t experts = c_.n_routed_experts, inter = c_.moe_intermediate_size;
      const int64_t shared = c_.n_shared_experts;
      CudaMoeWeights moe;
      moe.groups = static_cast<int>(experts + shared);
      moe.inter = inter;
      ASSIGN_OR_RETURN(float* router, Alloc<float>(experts * hidden, "router"));
      RETURN_IF_ERROR(Router(m + "gate.weight", hm ? &hm->router : nullptr, experts, hidden, router));
      moe.router = router;
      if (c_.topk_method == TopkMethod::kNoauxTc) {
        ASSIGN_OR_RETURN(moe.correction_bias, Vector(m + "gate.e_score_correction_bias",
                                                     hm ? hm->correction_bias : nullptr, experts, RandomInit::kBias,
                                                     /*stored_bf16=*/false));
      }
      ASSIGN_OR_RETURN(moe.gate_up, Alloc<__nv_bfloat16>(moe.groups * 2 * inter * hidden, "expert gate_up"));
      ASSIGN_OR_RETURN(moe.down, Alloc<__nv_bfloat16>(moe.groups * hidden * inter, "expert down"));
      ASSIGN_OR_RETURN(ExpertsFp8 fp8, NewExpertsFp8(m, hm, moe.groups));
      for (int64_t e = 0; e < experts; ++e) {
        const std::string ep = absl::StrCat(m, "experts.", e, ".");
        const MlpWeights* he = hm ? &hm->experts[e] : nullptr;
        const Fp8Dest gate = fp8.GateUp(e, 0), up = fp8.GateUp(e, inter), down = fp8.Down(e);
        RETURN_IF_ERROR(GateUp(ep, he, inter, 1, moe.gate_up + e * 2 * inter * hidden, fp8.on ? &gate : nullptr,
                               fp8.on ? &up : nullptr));
        RETURN_IF_ERROR(Fill(ep + "down_proj.weight", he ? &he->down : nullptr, hidden, inter, RandomInit::kLinear,
                             moe.down + e * hidden * inter, fp8.on ? &down : nullptr));
      }
      if (shared > 0) {
        const std::string sp = m + "shared_experts.";
        const MlpWeights* hs = hm && hm->shared ? &*hm->shared : nullptr;
        // The shared experts' FP8 forms whole first (scratch), then split like the bf16 ones.
        DeviceBuffer shared_codes, shared_scales;
        const int64_t hb = (hidden + 127) / 128, ib = inter / 128;
        Fp8Dest sg, su, sd;
        if (fp8.on) {
          RETURN_IF_ERROR(shared_codes.Allocate(static_cast<size_t>(3 * shared * inter * hidden), "FP8 scratch"));
          RETURN_IF_ERROR(shared_scales.Allocate(static_cast<size_t>(3 * shared * ib * hb) * 4, "FP8 scratch"));
          uint8_t* sc = shared_codes.get<uint8_t>();
          float* ss = shared_scales.get<float>();
          sg = {sc, ss};
          su = {sc + shared * inter * hidden, ss + shared * ib * hb};
          sd = {sc + 2 * shared * inter * hidden, ss + 2 * shared * ib * hb};
        }
        RETURN_IF_ERROR(GateUp(sp, hs, inter, static_cast<int>(shared), moe.gate_up + experts * 2 * inter * hidden,
                               fp8.on ? &sg : nullptr, fp8.on ? &su : nullptr));
        // down [hidden][shared * inter]: column range s becomes group experts + s.
        ASSIGN_OR_RETURN(__nv_bfloat16 * tmp, Temp(0, hidden * shared * inter));
        RETURN_IF_ERROR(Fill(sp + "down_proj.weight", hs ? &hs->down : nullptr, hidden, shared * inter,
                             RandomInit::kLinear, tmp, fp8.on ? &sd : nullptr));
        for (int64_t j = 0; j < shared; ++j) {
          TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(moe.down + (experts + j) * hidden * inter, inter * 2, tmp + j * inter,
                                               shared * inter * 2, inter * 2, hidden, cudaMemcpyDeviceToDevice, stream_),
                             "splitting shared experts");
          if (!fp8.on) continue;
          // Rows [j inter, (j + 1) inter) of gate and up (whole scale rows: inter % 128 == 0),
          // columns [j inter, (j + 1) inter) of down (whole scale columns).
          const int64_t g = experts + j;
          for (const auto& [src, at] : {std::pair{sg, int64_t{0}}, std::pair{su, inter}}) {
            const Fp8Dest dst = fp8.GateUp(g, at);
            TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst.codes, src.codes + j * inter * hidden, inter * hidden,
                                               cudaMemcpyDeviceToDevice, stream_),
                               "splitting shared experts");
            TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst.scales, src.scales + j * ib * hb, ib * hb * 4,
                                               cudaMemcpyDeviceToDevice, stream_),
                               "splitting shared experts");
          }
          const Fp8Dest dst = fp8.Down(g);
          TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(dst.codes, inter, sd.codes + j * inter, shared * inter, inter, hidden,
                                               cudaMemcpyDeviceToDevice, stream_),
                             "splitting shared experts");
          TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(dst.scales, ib * 4, sd.scales + j * ib, shared * ib * 4, ib * 4, hb,
                                               cudaMemcpyDeviceToDevice, stream_),
                             "splitting shared experts");
        }
        if (fp8.on) TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "splitting shared experts");
      }
      if (fp8.on) {
        ASSIGN_OR_RETURN(moe.fp8, fp8.Finish(*this));
      }
      l.moe = moe;
    } else {
      const MlpWeights* hm = hl ? &*hl->mlp : nullptr;
      const int64_t inter = c_.intermediate_size;
      CudaMlpWeights mlp;
      ASSIGN_OR_RETURN(mlp.gate_up, NewMatrix(2 * inter, hidden, "gate_up"));
      std::vector<Fp8Dest> gu_fp8, down_fp8;
      ASSIGN_OR_RETURN(mlp.gate_up_fp8, StackFp8({{m + "gate_proj.weight", hm ? &hm->gate : nullptr, inter},
                                                  {m + "up_proj.weight", hm ? &hm->up : nullptr, inter}},
                                                 hidden, &gu_fp8));
      RETURN_IF_ERROR(GateUp(m, hm, inter, 1, mlp.gate_up.data, Fp8Or(gu_fp8[0]), Fp8Or(gu_fp8[1])));
      ASSIGN_OR_RETURN(mlp.down, NewMatrix(hidden, inter, "down"));
      ASSIGN_OR_RETURN(mlp.down_fp8, StackFp8({{m + "down_proj.weight", hm ? &hm->down : nullptr, hidden}}, inter,
                                              &down_fp8));
      RETURN_IF_ERROR(Fill(m + "down_proj.weight", hm ? &hm->down : nullptr, hidden, inter, RandomInit::kLinear,
                           mlp.down.data, Fp8Or(down_fp8[0])));
      l.mlp = mlp;
    }
    return l;
  }

  // gate_proj/up_proj [chunks * inter][hidden] into `chunks` consecutive [2 * inter][hidden]
  // matrices, each interleaving its gate and up rows in blocks of kGateUpInterleave.
  absl::Status GateUp(const std::string& prefix, const MlpWeights* host, int64_t inter, int chunks,
                      __nv_bfloat16* dst, const Fp8Dest* gate_fp8 = nullptr, const Fp8Dest* up_fp8 = nullptr) {
    const int64_t hidden = c_.hidden_size, total = inter * chunks;
    if (inter % kGateUpInterleave != 0) {
      return absl::InvalidArgumentError(absl::StrCat("intermediate size ", inter, " is not a multiple of ",
                                                     kGateUpInterleave, " (needed by the CUDA backend)"));
    }
    ASSIGN_OR_RETURN(__nv_bfloat16 * gate, Temp(0, total * hidden));
    ASSIGN_OR_RETURN(__nv_bfloat16 * up, Temp(1, total * hidden));
    RETURN_IF_ERROR(Fill(prefix + "gate_proj.weight", host ? &host->gate : nullptr, total, hidden,
                         RandomInit::kLinear, gate, gate_fp8));
    RETURN_IF_ERROR(Fill(prefix + "up_proj.weight", host ? &host->up : nullptr, total, hidden, RandomInit::kLinear,
                         up, up_fp8));
    const size_t block = static_cast<size_t>(kGateUpInterleave) * hidden * 2;  // bytes of 8 rows
    for (int j = 0; j < chunks; ++j) {
      __nv_bfloat16* d = dst + static_cast<int64_t>(j) * 2 * inter * hidden;
      const int64_t src_off = static_cast<int64_t>(j) * inter * hidden;
      TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(d, 2 * block, gate + src_off, block, block, inter / kGateUpInterleave,
                                           cudaMemcpyDeviceToDevice, stream_),
                         "interleaving gate_up");
      TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(d + kGateUpInterleave * hidden, 2 * block, up + src_off, block, block,
                                           inter / kGateUpInterleave, cudaMemcpyDeviceToDevice, stream_),
                         "interleaving gate_up");
    }
    return absl::OkStatus();
  }

  uint64_t Key(const std::string& name) const { return XXH64(name.data(), name.size(), seed_); }

  // The construction's tensors that are more than scaled random values: the embeddings and
  // heads (token vectors) and eh_proj ([I | 0] plus noise).
  bool ConstructedOnHost(const std::string& name) const {
    return name.ends_with("embed_tokens.weight") || name == "lm_head.weight" ||
           name.ends_with("shared_head.head.weight") || name.ends_with("eh_proj.weight");
  }
  // Such a tensor as make-model writes it: drawn as the generator draws (kLinear: normal /
  // sqrt(cols); only eh_proj keeps any of it), adjusted by the construction, in bf16.
  absl::Status FillConstructed(const std::string& name, int64_t rows, int64_t cols, __nv_bfloat16* dst) {
    std::vector<float> values(static_cast<size_t>(rows * cols), 0.0f);
    if (name.ends_with("eh_proj.weight")) {
      const uint64_t key = Key(name);
      const float root = std::sqrt(static_cast<float>(cols));
      for (size_t i = 0; i < values.size(); ++i) values[i] = generator::NormalSample(key, i) / root;
    }
    test_->Adjust(name, {rows, cols}, values);
    std::vector<uint16_t> bf16(values.size());
    for (size_t i = 0; i < values.size(); ++i) bf16[i] = F32ToBf16(values[i]);
    TANDEM_CUDA_RETURN(cudaMemcpy(dst, bf16.data(), bf16.size() * 2, cudaMemcpyHostToDevice), "uploading");
    return absl::OkStatus();
  }

  // The tensors make-model stores in FP8 when asked (not the embeddings and LM heads; the
  // router is not filled here).
  static bool Quantizable(const std::string& name) {
    return !name.ends_with("embed_tokens.weight") && name != "lm_head.weight" &&
           !name.ends_with("shared_head.head.weight");
  }
  // Whether Fill can keep the tensor's FP8 form.
  bool WillBeFp8(const std::string& name, const WeightMatrix* host) const {
    if (!fp8_forms_) return false;
    if (host == nullptr) return generate_fp8_ && Quantizable(name);
    return host->dtype == DType::kF8E4M3 && host->block_scales != nullptr;
  }
  // Generated, FP8 config: the make-model values in float32, quantized as make-model does,
  // the bf16 copy their dequantization.
  absl::Status FillGeneratedFp8(const std::string& name, int64_t rows, int64_t cols, __nv_bfloat16* dst,
                                const Fp8Dest* fp8) {
    const int64_t n = rows * cols, num_scales = ((rows + 127) / 128) * ((cols + 127) / 128);
    ASSIGN_OR_RETURN(void* raw, Raw(n * 5));  // float32 values, then the codes
    if (scales_.bytes() < static_cast<size_t>(num_scales) * 4) {
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "generating weights");
      RETURN_IF_ERROR(scales_.Allocate(num_scales * 4, "weight scales"));
    }
    float* values = static_cast<float*>(raw);
    uint8_t* codes = fp8 != nullptr ? fp8->codes : static_cast<uint8_t*>(raw) + n * 4;
    float* scales = fp8 != nullptr ? fp8->scales : scales_.get<float>();
    TANDEM_CUDA_RETURN(cuda::RandomInitFill({.key = Key(name), .n = n, .fan_in = cols, .init = RandomInit::kLinear,
                                             .out_f32 = values},
                                            stream_),
                       "generating weights");
    TANDEM_CUDA_RETURN(cuda::QuantizeFp8Block({.src = values, .codes = codes, .scales = scales, .rows = rows, .cols = cols},
                                              stream_),
                       "quantizing generated weights");
    return CudaStatus(cuda::DequantizeFp8ToBf16({.src = codes, .scales = scales, .dst = dst, .rows = rows, .cols = cols},
                                                stream_),
                      "dequantizing fp8");
  }

  static const Fp8Dest* Fp8Or(const Fp8Dest& d) { return d.codes != nullptr ? &d : nullptr; }

  // A MoE layer's FP8 expert storage while it loads: per group, gate_up [2 inter][hidden]
  // (gate rows, then up rows) and down [hidden][inter], each with its block scales in its own
  // array. Only the down codes stay; gate_up and the block scales are scratch, turned into
  // MoeExpertGemv's form (interleaved rows, row scales) by Finish.
  struct ExpertsFp8 {
    bool on = false;
    int64_t groups = 0, inter = 0, hidden = 0;
    DeviceBuffer gu_buffer, gu_scale_buffer, down_scale_buffer;  // scratch
    uint8_t* gu_codes = nullptr;
    float* gu_scales = nullptr;
    uint8_t* down_codes = nullptr;
    float* down_scales = nullptr;
    int64_t GuScales() const { return (2 * inter / 128) * ((hidden + 127) / 128); }
    int64_t DownScales() const { return ((hidden + 127) / 128) * (inter / 128); }
    // Group g's gate_up rows from `row` on (0: gate, inter: up).
    Fp8Dest GateUp(int64_t g, int64_t row) const {
      if (!on) return {};
      return {gu_codes + (g * 2 * inter + row) * hidden, gu_scales + g * GuScales() + (row / 128) * ((hidden + 127) / 128)};
    }
    Fp8Dest Down(int64_t g) const {
      if (!on) return {};
      return {down_codes + g * hidden * inter, down_scales + g * DownScales()};
    }
    // Once every group is written: the interleaved gate_up and the row scales, then the
    // scratch released (after the stream has used it).
    absl::StatusOr<Fp8Experts> Finish(Builder& b) {
      const int64_t hb = (hidden + 127) / 128, ib = inter / 128;
      ASSIGN_OR_RETURN(uint8_t * il, b.Alloc<uint8_t>(groups * 2 * inter * hidden, "FP8 expert gate_up"));
      ASSIGN_OR_RETURN(float* gu_rows, b.Alloc<float>(groups * 2 * inter * hb, "FP8 expert row scales"));
      ASSIGN_OR_RETURN(float* down_rows, b.Alloc<float>(groups * hidden * ib, "FP8 expert row scales"));
      b.out_->fp8_bytes += static_cast<uint64_t>(groups * (2 * inter * hidden + 4 * (2 * inter * hb + hidden * ib)));
      const size_t block = static_cast<size_t>(kGateUpInterleave * hidden);  // bytes of 8 rows
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* d = il + g * 2 * inter * hidden;
        const uint8_t* src = gu_codes + g * 2 * inter * hidden;
        TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(d, 2 * block, src, block, block, inter / kGateUpInterleave,
                                             cudaMemcpyDeviceToDevice, b.stream_),
                           "interleaving FP8 gate_up");
        TANDEM_CUDA_RETURN(cudaMemcpy2DAsync(d + block, 2 * block, src + inter * hidden, block, block,
                                             inter / kGateUpInterleave, cudaMemcpyDeviceToDevice, b.stream_),
                           "interleaving FP8 gate_up");
      }
      TANDEM_CUDA_RETURN(cuda::ExpandRowScales({.src = gu_scales, .dst = gu_rows, .groups = groups, .rows = 2 * inter,
                                                .cols = hb, .gate_up_interleaved = true},
                                               b.stream_),
                         "expanding FP8 scales");
      TANDEM_CUDA_RETURN(cuda::ExpandRowScales({.src = down_scales, .dst = down_rows, .groups = groups, .rows = hidden,
                                                .cols = ib},
                                               b.stream_),
                         "expanding FP8 scales");
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(b.stream_), "expanding FP8 scales");
      gu_buffer = DeviceBuffer();
      gu_scale_buffer = DeviceBuffer();
      down_scale_buffer = DeviceBuffer();
      return Fp8Experts{.gate_up_interleaved = il, .gate_up_row_scales = gu_rows, .down_codes = down_codes,
                        .down_row_scales = down_rows};
    }
  };
  // Allocates a MoE layer's FP8 expert storage when fp8_forms, every expert tensor will be
  // FP8 and moe_intermediate_size is a multiple of 128 (the shared experts split on whole
  // scale blocks); else `on` is false.
  absl::StatusOr<ExpertsFp8> NewExpertsFp8(const std::string& m, const MoeWeights* hm, int64_t groups) {
    ExpertsFp8 x{.groups = groups, .inter = c_.moe_intermediate_size, .hidden = c_.hidden_size};
    if (!fp8_forms_ || x.inter % 128 != 0 || x.hidden % 16 != 0) return x;
    auto fp8 = [&](const std::string& prefix, const MlpWeights* w) {
      return WillBeFp8(prefix + "gate_proj.weight", w ? &w->gate : nullptr) &&
             WillBeFp8(prefix + "up_proj.weight", w ? &w->up : nullptr) &&
             WillBeFp8(prefix + "down_proj.weight", w ? &w->down : nullptr);
    };
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      if (!fp8(absl::StrCat(m, "experts.", e, "."), hm ? &hm->experts[e] : nullptr)) return x;
    }
    if (c_.n_shared_experts > 0 && !fp8(m + "shared_experts.", hm && hm->shared ? &*hm->shared : nullptr)) return x;
    RETURN_IF_ERROR(x.gu_buffer.Allocate(static_cast<size_t>(groups * 2 * x.inter * x.hidden), "FP8 expert gate_up"));
    RETURN_IF_ERROR(x.gu_scale_buffer.Allocate(static_cast<size_t>(groups * x.GuScales()) * 4, "FP8 expert scales"));
    RETURN_IF_ERROR(x.down_scale_buffer.Allocate(static_cast<size_t>(groups * x.DownScales()) * 4, "FP8 expert scales"));
    x.gu_codes = x.gu_buffer.get<uint8_t>();
    x.gu_scales = x.gu_scale_buffer.get<float>();
    x.down_scales = x.down_scale_buffer.get<float>();
    ASSIGN_OR_RETURN(x.down_codes, Alloc<uint8_t>(groups * x.hidden * x.inter, "FP8 expert down"));
    out_->fp8_bytes += static_cast<uint64_t>(groups * x.inter * x.hidden);
    ++out_->fp8_linears;
    x.on = true;
    return x;
  }

  // Allocates the FP8 form of a linear stacked from parts (name, host tensor, rows) of
  // `cols` columns, when every part will be FP8 (else returns an empty Fp8Linear and null
  // destinations); dest[i]: where Fill leaves part i.
  struct Part {
    std::string name;
    const WeightMatrix* host;
    int64_t rows;
  };
  absl::StatusOr<Fp8Linear> StackFp8(const std::vector<Part>& parts, int64_t cols, std::vector<Fp8Dest>* dest) {
    dest->assign(parts.size(), Fp8Dest{});
    int64_t rows = 0, scale_rows = 0;
    bool one = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!WillBeFp8(parts[i].name, parts[i].host) || cols % 16 != 0) return Fp8Linear{};
      rows += parts[i].rows;
      scale_rows += (parts[i].rows + 127) / 128;
      one = one && (i + 1 == parts.size() || parts[i].rows % 128 == 0);
    }
    const int64_t scale_cols = (cols + 127) / 128;
    ASSIGN_OR_RETURN(uint8_t* codes, Alloc<uint8_t>(rows * cols, "FP8 weights"));
    ASSIGN_OR_RETURN(float* scales, Alloc<float>(scale_rows * scale_cols, "FP8 weight scales"));
    out_->fp8_bytes += static_cast<uint64_t>(rows * cols + scale_rows * scale_cols * 4);
    ++out_->fp8_linears;
    Fp8Linear linear;
    int64_t at = 0, scale_at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      (*dest)[i] = {codes + at * cols, scales + scale_at * scale_cols};
      if (!one) linear.parts.push_back({codes + at * cols, scales + scale_at * scale_cols, parts[i].rows, cols});
      at += parts[i].rows;
      scale_at += (parts[i].rows + 127) / 128;
    }
    if (one) linear.parts.push_back({codes, scales, rows, cols});
    return linear;
  }

  // Tensor `name` as bf16 into dst [rows][cols]; with `fp8` (for a tensor WillBeFp8) its
  // FP8 codes and block scales there as well.
  absl::Status Fill(const std::string& name, const WeightMatrix* host, int64_t rows, int64_t cols, RandomInit init,
                    __nv_bfloat16* dst, const Fp8Dest* fp8 = nullptr) {
    const int64_t n = rows * cols;
    if (host == nullptr && test_ != nullptr && ConstructedOnHost(name)) return FillConstructed(name, rows, cols, dst);
    if (host == nullptr && generate_fp8_ && Quantizable(name)) return FillGeneratedFp8(name, rows, cols, dst, fp8);
    if (host == nullptr) {
      // The construction scales what each block adds to the residual stream.
      const bool scaled = test_ != nullptr && (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight"));
      return CudaStatus(cuda::RandomInitFill({.key = Key(name), .n = n, .fan_in = cols, .init = init, .out_bf16 = dst,
                                              .scale = scaled ? kMtpTestLayerOutputScale : 1.0f},
                                             stream_),
                        "generating weights");
    }
    if (host->rows != rows || host->cols != cols) {
      return absl::InternalError(absl::StrCat("tensor '", name, "' has an unexpected shape"));
    }
    switch (host->dtype) {
      case DType::kBF16:
        TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, host->data, n * 2, cudaMemcpyHostToDevice, stream_), "uploading");
        return absl::OkStatus();
      case DType::kF32: {
        ASSIGN_OR_RETURN(void* raw, Raw(n * 4));
        TANDEM_CUDA_RETURN(cudaMemcpyAsync(raw, host->data, n * 4, cudaMemcpyHostToDevice, stream_), "uploading");
        return CudaStatus(cuda::ConvertF32ToBf16({.src = raw, .src_stride = cols, .dst = dst, .dst_stride = cols,
                                                  .rows = rows, .cols = cols},
                                                 stream_),
                          "converting to bf16");
      }
      case DType::kF8E4M3: {
        const int64_t num_scales = ((rows + 127) / 128) * ((cols + 127) / 128);
        ASSIGN_OR_RETURN(void* raw, Raw(n));
        if (scales_.bytes() < static_cast<size_t>(num_scales) * 4) {
          TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "uploading weights");
          RETURN_IF_ERROR(scales_.Allocate(num_scales * 4, "weight scales"));
        }
        TANDEM_CUDA_RETURN(cudaMemcpyAsync(raw, host->data, n, cudaMemcpyHostToDevice, stream_), "uploading");
        TANDEM_CUDA_RETURN(cudaMemcpyAsync(scales_.get(), host->block_scales, num_scales * 4, cudaMemcpyHostToDevice,
                                           stream_),
                           "uploading scales");
        if (fp8 != nullptr) {
          TANDEM_CUDA_RETURN(cudaMemcpyAsync(fp8->codes, raw, n, cudaMemcpyDeviceToDevice, stream_), "keeping FP8 codes");
          TANDEM_CUDA_RETURN(cudaMemcpyAsync(fp8->scales, scales_.get(), num_scales * 4, cudaMemcpyDeviceToDevice, stream_),
                             "keeping FP8 scales");
        }
        return CudaStatus(cuda::DequantizeFp8ToBf16({.src = static_cast<const uint8_t*>(raw),
                                                     .scales = scales_.get<float>(), .dst = dst, .rows = rows,
                                                     .cols = cols},
                                                    stream_),
                          "dequantizing fp8");
      }
      case DType::kF16:
      case DType::kF8E8M0:
      case DType::kI8:
      case DType::kU8:
      case DType::kI32:
      case DType::kI64:
        break;
    }
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has a type the CUDA backend cannot load"));
  }

  // The router, float32 (the loader keeps it in float32; generated: bf16-stored values).
  absl::Status Router(const std::string& name, const WeightMatrix* host, int64_t rows, int64_t cols, float* dst) {
    if (host == nullptr) {
      return CudaStatus(cuda::RandomInitFill({.key = Key(name), .n = rows * cols, .fan_in = cols,
                                              .init = RandomInit::kLinear, .out_f32 = dst, .round_to_bf16 = true},
                                             stream_),
                        "generating weights");
    }
    if (host->dtype != DType::kF32 || host->rows != rows || host->cols != cols) {
      return absl::InternalError(absl::StrCat("router '", name, "' is not a float32 [", rows, ", ", cols, "] matrix"));
    }
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, host->data, rows * cols * 4, cudaMemcpyHostToDevice, stream_),
                       "uploading the router");
    return absl::OkStatus();
  }

  absl::StatusOr<const float*> Vector(const std::string& name, const float* host, int64_t n, RandomInit init,
                                      bool stored_bf16) {
    ASSIGN_OR_RETURN(float* dst, Alloc<float>(n, "vector"));
    if (host == nullptr && test_ != nullptr && name.ends_with("norm.weight")) {
      // The construction's norms are 1 (mtp_test_model.h).
      ones_.assign(static_cast<size_t>(n), 1.0f);
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, ones_.data(), n * 4, cudaMemcpyHostToDevice, stream_), "uploading");
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "uploading");
    } else if (host == nullptr) {
      TANDEM_CUDA_RETURN(cuda::RandomInitFill({.key = Key(name), .n = n, .fan_in = 1, .init = init, .out_f32 = dst,
                                               .round_to_bf16 = stored_bf16},
                                              stream_),
                         "generating weights");
    } else {
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, host, n * 4, cudaMemcpyHostToDevice, stream_), "uploading");
    }
    return dst;
  }

  template <typename T>
  absl::StatusOr<T*> Alloc(int64_t count, const char* what) {
    DeviceBuffer b;
    RETURN_IF_ERROR(b.Allocate(static_cast<size_t>(count) * sizeof(T), what));
    T* p = b.get<T>();
    out_->bytes += b.bytes();
    out_->buffers.push_back(std::move(b));
    return p;
  }

  absl::StatusOr<DeviceMatrix> NewMatrix(int64_t rows, int64_t cols, const char* what) {
    ASSIGN_OR_RETURN(__nv_bfloat16 * p, Alloc<__nv_bfloat16>(rows * cols, what));
    return DeviceMatrix{p, rows, cols};
  }

  // Scratch reused across tensors; the stream orders the reuse.
  absl::StatusOr<__nv_bfloat16*> Temp(int slot, int64_t elems) {
    DeviceBuffer& t = temp_[slot];
    if (t.bytes() < static_cast<size_t>(elems) * 2) {
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "uploading weights");
      RETURN_IF_ERROR(t.Allocate(static_cast<size_t>(elems) * 2, "weight conversion scratch"));
    }
    return t.get<__nv_bfloat16>();
  }
  absl::StatusOr<void*> Raw(int64_t bytes) {
    if (raw_.bytes() < static_cast<size_t>(bytes)) {
      TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "uploading weights");
      RETURN_IF_ERROR(raw_.Allocate(static_cast<size_t>(bytes), "weight conversion scratch"));
    }
    return raw_.get();
  }

  const ModelConfig& c_;
  const ModelWeights* host_;
  uint64_t seed_;
  cudaStream_t stream_;
  bool mtp_;
  const MtpTestWeights* test_;
  const bool fp8_forms_;
  // Generated weights of an FP8 config: the quantizable tensors as make-model writes them
  // (quantized), their bf16 copies dequantized from that.
  const bool generate_fp8_;
  std::unique_ptr<CudaModelWeights> out_;
  std::vector<float> ones_;
  DeviceBuffer temp_[2], raw_, scales_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModelWeights>> UploadWeights(const ModelConfig& config, const ModelWeights* host,
                                                                uint64_t seed, cudaStream_t stream, bool mtp,
                                                                const MtpTestWeights* test, bool fp8_forms) {
  return Builder(config, host, seed, stream, mtp, test, fp8_forms).Build();
}

}  // namespace tandem::cuda_model
