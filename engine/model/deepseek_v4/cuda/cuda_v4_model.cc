#include "engine/model/deepseek_v4/cuda/cuda_v4_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/model/cuda/cuda_graph.h"
#include "engine/model/deepseek_v4/cuda/cuda_v4_step.h"
#include "engine/model/deepseek_v4/v4_kv_streams.h"
#include "engine/util/status_macros.h"
#include "kernels/common/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/hyper_connections.h"
#include "kernels/cuda/quantized_gemv.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sink_attention.h"
#include "kernels/cuda/unit_rms_norm.h"
#include "kernels/cuda/v4_compressor.h"
#include "kernels/cuda/v4_key_select.h"

namespace tandem::v4::cuda_v4 {

using cuda_model::DeviceBuffer;
using step_detail::Kernel;
using step_detail::RunCopies;
using step_detail::kDeviceRoutedProblems;
using step_detail::kMaxGraphs;
using step_detail::kMaxWidenedElements;

CudaV4Model::~CudaV4Model() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (side_stream_ != nullptr) cudaStreamSynchronize(side_stream_);
  DropGraphs();
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::vector<KvStream> CudaV4Model::kv_streams() const { return KvStreamsFor(config_, /*mtp=*/false); }

namespace {

absl::Status SelectDevice(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda:", device, ": no such CUDA device (this machine shows ", count, ")"));
  }
  TANDEM_CUDA_RETURN(cudaSetDevice(device), "selecting the GPU");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaV4Model>> CudaV4Model::Load(const std::string& dir, const Options& options) {
  RETURN_IF_ERROR(SelectDevice(options.device));  // before the weights are read
  ASSIGN_OR_RETURN(DeepseekV4Config config, LoadDeepseekV4Config(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedWeights> host, LoadedWeights::Load(config, dir));
  return Create(config, host->weights(), options);  // everything the GPU reads is then on the GPU
}

absl::StatusOr<std::unique_ptr<CudaV4Model>> CudaV4Model::Create(const DeepseekV4Config& config,
                                                                  const ModelWeights& weights,
                                                                  const Options& options) {
  RETURN_IF_ERROR(SelectDevice(options.device));
  std::unique_ptr<CudaV4Model> m(new CudaV4Model());
  m->device_ = options.device;
  m->graphs_on_ = options.cuda_graphs;
  m->shared_beside_on_ = options.shared_expert_beside;
  m->fp8_gemm_on_ = options.fp8_gemm;
  m->config_ = config;
  ASSIGN_OR_RETURN(m->weights_, UploadV4Weights(m->config_, weights));
  if (m->weights_->max_narrow_elements > 0) {
    m->widened_elements_ = std::min(m->weights_->max_narrow_elements, kMaxWidenedElements);
    RETURN_IF_ERROR(m->widened_.Allocate(static_cast<size_t>(m->widened_elements_) * sizeof(float),
                                         "the narrow matrices' widening scratch"));
  }
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking), "creating a CUDA stream");
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&m->side_stream_, cudaStreamNonBlocking), "creating a CUDA stream");
  TANDEM_CUDA_RETURN(cudaEventCreateWithFlags(&m->fork_, cudaEventDisableTiming), "creating a CUDA event");
  TANDEM_CUDA_RETURN(cudaEventCreateWithFlags(&m->join_, cudaEventDisableTiming), "creating a CUDA event");
  TANDEM_CUBLAS_RETURN(m->gemm_.Init(), "creating the cuBLAS handle");
  auto upload = [&](const std::vector<float>& v, const float** out) -> absl::Status {
    DeviceBuffer b;
    RETURN_IF_ERROR(b.Allocate(v.size() * sizeof(float), "rope frequencies"));
    TANDEM_CUDA_RETURN(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
                       "uploading rope frequencies");
    *out = b.get<const float>();
    m->constants_.push_back(std::move(b));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(upload(m->config_.main_rope.InverseFrequencies(), &m->main_inv_freq_));
  RETURN_IF_ERROR(upload(m->config_.compress_rope.InverseFrequencies(), &m->compress_inv_freq_));
  m->step_ = std::make_unique<Step>();
  RETURN_IF_ERROR(m->step_->host_ids.Allocate(256, "routing results"));
  RETURN_IF_ERROR(m->step_->host_bad.Allocate(2 * sizeof(int32_t), "error flags"));
  return m;
}

absl::Status CudaV4Model::EnsurePool(const KvPool::Geometry& g) {
  if (pool_ != nullptr) {
    const KvPool::Geometry& h = pool_->geometry();
    if (h.num_layers == g.num_layers && h.block_size == g.block_size && h.num_blocks == g.num_blocks &&
        h.num_sequence_slots == g.num_sequence_slots) {
      return absl::OkStatus();
    }
  }
  pool_.reset();
  DropGraphs();  // they hold the old pool's addresses
  ASSIGN_OR_RETURN(const size_t bytes, KvPool::BytesFor(kv_streams(), g));
  RETURN_IF_ERROR(pool_memory_.Allocate(bytes, "the KV pool"));
  TANDEM_CUDA_RETURN(cudaMemset(pool_memory_.get(), 0, bytes), "zeroing the KV pool");
  ASSIGN_OR_RETURN(pool_, KvPool::CreateOver({pool_memory_.get<std::byte>(), bytes}, kv_streams(), g));
  return absl::OkStatus();
}

absl::Status CudaV4Model::CopyPoolTo(KvPool& host) {
  if (pool_ == nullptr) return absl::FailedPreconditionError("no GPU pool yet");
  if (host.memory().size() != pool_->memory().size()) {
    return absl::InvalidArgumentError("the host pool's layout differs from the GPU pool's");
  }
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "finishing the GPU's work");
  TANDEM_CUDA_RETURN(cudaMemcpy(host.memory().data(), pool_->memory().data(), host.memory().size(),
                                cudaMemcpyDeviceToHost),
                     "copying the KV pool");
  return absl::OkStatus();
}

absl::Status CudaV4Model::CopyRanges(std::span<const KvExtent> ranges, KvPool& host, bool to_host) {
  RETURN_IF_ERROR(EnsurePool(host.geometry()));
  const size_t size = pool_->memory().size();
  if (host.memory().size() != size) return absl::InvalidArgumentError("the host pool's layout differs from the GPU pool's");
  for (const KvExtent& r : ranges) {
    if (r.offset > size || r.bytes > size - r.offset) {
      return absl::InvalidArgumentError(absl::StrCat("KV range [", r.offset, ", +", r.bytes, ") is outside the pool"));
    }
  }
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "selecting the GPU");
  std::byte* device = pool_->memory().data();
  std::byte* mirror = host.memory().data();
  for (const KvExtent& r : ranges) {
    if (r.bytes == 0) continue;
    TANDEM_CUDA_RETURN(to_host ? cudaMemcpyAsync(mirror + r.offset, device + r.offset, r.bytes, cudaMemcpyDeviceToHost,
                                                 stream_)
                               : cudaMemcpyAsync(device + r.offset, mirror + r.offset, r.bytes, cudaMemcpyHostToDevice,
                                                 stream_),
                       "copying KV between the GPU and the host");
  }
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "copying KV between the GPU and the host");
  return absl::OkStatus();
}

absl::Status CudaV4Model::CopyStateSlot(int64_t from, int64_t to) {
  if (pool_ == nullptr) return absl::FailedPreconditionError("no GPU pool yet");
  const int64_t slots = pool_->geometry().num_sequence_slots;
  if (from < 0 || from >= slots || to < 0 || to >= slots) {
    return absl::InvalidArgumentError(absl::StrCat("state slots ", from, " -> ", to, " of ", slots));
  }
  if (from == to) return absl::OkStatus();
  const std::vector<std::span<std::byte>> src = pool_->StateImage(from), dst = pool_->StateImage(to);
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "selecting the GPU");
  for (size_t i = 0; i < src.size(); ++i) {
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst[i].data(), src[i].data(), src[i].size(), cudaMemcpyDeviceToDevice, stream_),
                       "copying a state slot");
  }
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "copying a state slot");
  return absl::OkStatus();
}

absl::Status CudaV4Model::Check(std::span<const ForwardSequence> batch) const {
  if (pool_ == nullptr) return absl::FailedPreconditionError("no GPU pool (EnsurePool)");
  if (batch.empty()) return absl::InvalidArgumentError("no sequences to run");
  const int64_t bs = pool_->geometry().block_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    const std::string who = absl::StrCat("sequence ", i, ": ");
    if (s.mtp || s.keep_hidden || s.first_kv_cached || s.num_drafts > 0) {
      return absl::UnimplementedError(who + "speculative decoding is not on the GPU for DeepSeek-V4 yet");
    }
    if (s.tokens.empty()) return absl::InvalidArgumentError(who + "no tokens to run");
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      if (s.tokens[t] < 0 || s.tokens[t] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(who, "token ", t, " is ", s.tokens[t],
                                                       ", outside the vocabulary of ", config_.vocab_size));
      }
    }
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.start_position < 0 || end > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(who, "positions up to ", end, " exceed max_position_embeddings (",
                                                     config_.max_position_embeddings, ")"));
    }
    if (static_cast<int64_t>(s.block_table.size()) * bs < end) {
      return absl::InvalidArgumentError(absl::StrCat(who, "its ", s.block_table.size(), " blocks do not cover ", end,
                                                     " positions"));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= pool_->geometry().num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(who, "block ", b, " is outside the pool"));
      }
    }
    if (s.state_slot < 0 || s.state_slot >= pool_->geometry().num_sequence_slots) {
      return absl::InvalidArgumentError(absl::StrCat(who, "state slot ", s.state_slot, " is outside the pool"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaV4Model::Linear(const float* x, int64_t ldx, const DeviceMatrix& w, float* y, int64_t ldy,
                                 int64_t m) {
  if (m == 0) return absl::OkStatus();
  const float* const dense = w.data;
  if (w.narrow()) {
    if (fp8_pass_ && w.format == cuda::QuantizedWeight::kFp8Block128) {
      ASSIGN_OR_RETURN(const bool done, Fp8GemmLinear(x, ldx, w, y, ldy, m));
      if (done) return absl::OkStatus();
    }
    // Decode-sized products read the narrow codes directly (memory-bound on the weights);
    // larger ones widen the matrix and run the float32 GEMM.
    if (m <= cuda::kQuantizedGemvMaxRows &&
        cuda::QuantizedGemvSharedBytes(m, w.cols) <= cuda::kQuantizedGemvMaxSharedBytes) {
      return Kernel(cuda::QuantizedGemv({.format = w.format, .w = w.codes, .scales = w.scales, .x = x, .ldx = ldx,
                                         .y = y, .ldy = ldy, .m = static_cast<int>(m), .n = w.rows, .k = w.cols},
                                        stream_),
                    "a narrow matrix-vector product");
    }
    // Slabs of whole 128-row scale blocks (FP8), widened into the scratch one at a time.
    float* wide = widened_.get<float>();
    const int64_t slab = std::max<int64_t>(128, widened_elements_ / w.cols / 128 * 128);
    TANDEM_CHECK_LE(std::min(slab, w.rows) * w.cols, widened_elements_);
    const int64_t scale_cols = (w.cols + 127) / 128;
    for (int64_t r0 = 0; r0 < w.rows; r0 += slab) {
      const int64_t rows = std::min(slab, w.rows - r0);
      cudaError_t err = cudaSuccess;
      switch (w.format) {
        case cuda::QuantizedWeight::kFp8Block128:
          err = cuda::DequantizeFp8ToF32({.src = w.codes + r0 * w.cols, .scales = w.scales + r0 / 128 * scale_cols,
                                          .dst = wide, .rows = rows, .cols = w.cols},
                                         stream_);
          break;
        case cuda::QuantizedWeight::kFp4Group32:
          err = cuda::DequantizeFp4ToF32({.src = w.codes + r0 * w.cols / 2, .scales = w.scales + r0 * (w.cols / 32),
                                          .dst = wide, .rows = rows, .cols = w.cols},
                                         stream_);
          break;
        case cuda::QuantizedWeight::kFp4Tiled:
          TANDEM_CHECK(false) << "cuda_v4_weights.cc uploads no tiled FP4";
          break;
        case cuda::QuantizedWeight::kBf16:
          err = cuda::ConvertBf16ToF32({.src = w.codes + r0 * w.cols * 2, .src_stride = w.cols, .dst = wide,
                                        .dst_stride = w.cols, .rows = rows, .cols = w.cols},
                                       stream_);
          break;
      }
      RETURN_IF_ERROR(Kernel(err, "widening a narrow matrix"));
      TANDEM_CUBLAS_RETURN(gemm_.LinearF32({.x = x, .ldx = ldx, .w = wide, .ldw = w.cols, .y = y + r0, .ldy = ldy,
                                            .m = m, .n = rows, .k = w.cols},
                                           stream_),
                           "a projection");
    }
    return absl::OkStatus();
  }
  TANDEM_CUBLAS_RETURN(gemm_.LinearF32({.x = x, .ldx = ldx, .w = dense, .ldw = w.cols, .y = y, .ldy = ldy, .m = m,
                                        .n = w.rows, .k = w.cols},
                                       stream_),
                       "a projection");
  return absl::OkStatus();
}


absl::Status CudaV4Model::HyperPre(const HyperSite& site, const float* norm) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const int64_t rows = st.rows, n = c.hc_mult, d = c.hidden_size, mw = (2 + n) * n;
  RETURN_IF_ERROR(Kernel(cuda::UnitRmsNorm({.x = st.streams, .x_stride = n * d, .out = st.flat, .out_stride = n * d,
                                            .rows = rows, .width = n * d, .eps = static_cast<float>(c.rms_norm_eps)},
                                           stream_),
                         "an mHC site's norm"));
  RETURN_IF_ERROR(Linear(st.flat, n * d, site.fn, st.mix, mw, rows));
  RETURN_IF_ERROR(Kernel(cuda::HyperMix({.mix = st.mix, .mix_stride = mw, .base = site.base, .scale = site.scale,
                                         .tokens = rows, .n = static_cast<int>(n),
                                         .sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters),
                                         .eps = static_cast<float>(c.hc_eps), .head = false, .pre = st.pre,
                                         .post = st.post, .comb = st.comb},
                                        stream_),
                         "an mHC site's weights"));
  RETURN_IF_ERROR(Kernel(cuda::HyperCollapse({.streams = st.streams, .pre = st.pre, .tokens = rows,
                                              .n = static_cast<int>(n), .dim = d, .out = st.u, .out_stride = d},
                                             stream_),
                         "an mHC collapse"));
  return Kernel(cuda::RmsNorm({.x = st.u, .weight = norm, .out = st.u, .rows = rows, .dim = d, .x_stride = d,
                               .out_stride = d, .eps = static_cast<float>(c.rms_norm_eps)},
                              stream_),
                "a layer norm");
}

absl::Status CudaV4Model::Block(int64_t layer) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const int64_t n = c.hc_mult, d = c.hidden_size;
  auto expand = [&]() {
    return Kernel(cuda::HyperExpand({.streams = st.streams, .post = st.post, .comb = st.comb, .f = st.sub,
                                     .f_stride = d, .tokens = st.rows, .n = static_cast<int>(n), .dim = d},
                                    stream_),
                  "an mHC expand");
  };
  RETURN_IF_ERROR(HyperPre(lw.attn_hc, lw.attn_norm));
  RETURN_IF_ERROR(Attention(layer));
  RETURN_IF_ERROR(expand());
  RETURN_IF_ERROR(HyperPre(lw.ffn_hc, lw.ffn_norm));
  RETURN_IF_ERROR(Moe(layer));
  return expand();
}

absl::Status CudaV4Model::Attention(int64_t layer) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const Step::Layer& sl = st.layers[static_cast<size_t>(layer)];
  const AttentionType type = c.layer_types[static_cast<size_t>(layer)];
  const int64_t rows = st.rows, d = c.head_dim, heads = c.num_attention_heads, hd = heads * d, xw = lw.x_cols.width;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const RopeTable& rope = c.RopeFor(type);
  const float* inv_freq = type == AttentionType::kSliding ? main_inv_freq_ : compress_inv_freq_;
  const int rot = static_cast<int>(rope.rotary_dim), crot = static_cast<int>(c.compress_rope.rotary_dim);
  const float af = static_cast<float>(rope.AttentionFactor()), caf = static_cast<float>(c.compress_rope.AttentionFactor());

  for (const XProjPart& part : lw.x_proj) {
    RETURN_IF_ERROR(Linear(st.u, c.hidden_size, part.matrix, st.xp + part.col, xw, rows));
  }
  RETURN_IF_ERROR(Kernel(cuda::RmsNorm({.x = st.xp + lw.x_cols.q_a, .weight = lw.q_a_norm, .out = st.cq, .rows = rows,
                                        .dim = c.q_lora_rank, .x_stride = xw, .out_stride = c.q_lora_rank, .eps = eps},
                                       stream_),
                         "q_a_norm"));
  RETURN_IF_ERROR(Kernel(cuda::RmsNorm({.x = st.xp + lw.x_cols.kv, .weight = lw.kv_norm, .out = st.kv, .rows = rows,
                                        .dim = d, .x_stride = xw, .out_stride = d, .eps = eps},
                                       stream_),
                         "kv_norm"));
  RETURN_IF_ERROR(Linear(st.cq, c.q_lora_rank, lw.q_b, st.q, hd, rows));
  // The query heads' norm and rope in one launch (a block per head).
  RETURN_IF_ERROR(Kernel(cuda::UnitRmsNorm({.x = st.q, .x_stride = d, .out = st.q, .out_stride = d,
                                            .rows = rows * heads, .width = d, .eps = eps, .rope_dim = rot,
                                            .positions = st.positions, .rows_per_position = heads,
                                            .inv_freq = inv_freq, .attention_factor = af, .interleaved = true},
                                           stream_),
                         "the query heads' norm and rope"));
  if (rot > 0) {
    RETURN_IF_ERROR(Kernel(cuda::Rope({.x = st.kv + d - rot, .rows = rows, .num_heads = 1, .row_stride = d,
                                       .head_stride = d, .rope_dim = rot, .positions = st.positions,
                                       .inv_freq = inv_freq, .attention_factor = af, .interleaved = true},
                                      stream_),
                           "the keys' rope"));
  }

  // The compressors: entries of the windows closing in this pass into the pool, then the
  // state (overlap halves before the unfinished windows, whose rows they may read).
  auto compress = [&](const CompressorJob& job, const Step::Compressor& dev, const Step::Copies& overlap,
                      const Step::Copies& partial, const CompressorParams& w, int64_t width,
                      int64_t proj) -> absl::Status {
    if (job.windows() > 0) {
      RETURN_IF_ERROR(Kernel(cuda::CompressorEmit({.slots = dev.slots, .num_slots = dev.num_slots,
                                                   .max_slots = job.max_slots, .windows = job.windows(),
                                                   .width = width, .norm = w.norm, .eps = eps,
                                                   .positions = dev.positions, .inv_freq = compress_inv_freq_,
                                                   .rope_dim = crot, .attention_factor = caf, .out = dev.out},
                                                  stream_),
                             "a compressor's entries"));
    }
    RETURN_IF_ERROR(RunCopies(overlap.src, overlap.bias, overlap.dst, overlap.rows, width, stream_,
                              "a compressor's overlap rows"));
    return RunCopies(partial.src, partial.bias, partial.dst, partial.rows, proj, stream_,
                     "a compressor's unfinished window");
  };
  const LayerPlan& lp = st.plan->layers[static_cast<size_t>(layer)];
  const bool csa = type == AttentionType::kCompressedSparse;
  const int64_t ni = c.index_n_heads, ci = c.index_head_dim;
  if (type != AttentionType::kSliding) {
    RETURN_IF_ERROR(compress(lp.main, sl.main, sl.main_overlap, sl.main_partial, lw.compressor, d, csa ? 2 * d : d));
  }
  if (csa) {
    RETURN_IF_ERROR(compress(lp.indexer, sl.indexer, sl.indexer_overlap, sl.indexer_partial, lw.indexer_compressor,
                             ci, 2 * ci));
    RETURN_IF_ERROR(Linear(st.cq, c.q_lora_rank, lw.index_q_b, st.index_q, ni * ci, rows));
    if (crot > 0) {
      RETURN_IF_ERROR(Kernel(cuda::Rope({.x = st.index_q + ci - crot, .rows = rows, .num_heads = static_cast<int>(ni),
                                         .row_stride = ni * ci, .head_stride = ci, .rope_dim = crot,
                                         .positions = st.positions, .inv_freq = compress_inv_freq_,
                                         .attention_factor = caf, .interleaved = true},
                                        stream_),
                             "the indexer queries' rope"));
    }
    RETURN_IF_ERROR(Linear(st.u, c.hidden_size, lw.index_weights, st.index_w, ni, rows));
  }

  // Each query's keys, the attention with sinks, the rope taken back off the outputs.
  const bool hca = type == AttentionType::kHeavilyCompressed;
  RETURN_IF_ERROR(Kernel(
      cuda::V4KeySelect({.tokens = rows, .token_seq = st.token_seq, .token_pos = st.positions,
                         .seq_start = st.seq_start, .seq_row0 = st.seq_row0, .seq_ring = sl.seq_ring,
                         .seq_entries = hca ? st.seq_entries_hca : st.seq_entries_csa,
                         .seq_entry_begin = hca ? st.seq_entry_begin_hca : st.seq_entry_begin_csa,
                         .chunk_kv = st.kv, .chunk_kv_stride = d, .window = static_cast<int>(c.sliding_window),
                         .head_dim = static_cast<int>(d), .type = csa ? 1 : (hca ? 2 : 0),
                         .rate = static_cast<int>(c.CompressRate(type)),
                         .entry_rows = hca ? st.entry_rows_hca : st.entry_rows_csa, .entries = lp.entries,
                         .index_keys = lp.index_keys, .index_q = st.index_q, .index_w = st.index_w,
                         .index_heads = static_cast<int>(ni), .index_head_dim = static_cast<int>(ci),
                         .topk = static_cast<int>(c.index_topk), .scores = st.scores,
                         .max_entries = st.max_entries_csa, .keys = st.keys,
                         .num_keys = st.num_keys, .max_keys = st.max_keys, .bad_input = st.bad},
                        stream_),
      "the attention's key lists"));
  RETURN_IF_ERROR(Kernel(cuda::SinkAttention({.q = st.q, .keys = st.keys, .num_keys = st.num_keys,
                                              .max_keys = st.max_keys, .sinks = lw.sinks, .tokens = rows,
                                              .heads = static_cast<int>(heads), .head_dim = static_cast<int>(d),
                                              .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))),
                                              .out = st.o, .bad_input = st.bad + 1,
                                              .partials = st.attention_partials,
                                              .partial_floats = st.attention_partial_floats},
                                             stream_),
                         "the attention"));
  if (rot > 0) {
    RETURN_IF_ERROR(Kernel(cuda::Rope({.x = st.o + d - rot, .rows = rows, .num_heads = static_cast<int>(heads),
                                       .row_stride = hd, .head_stride = d, .rope_dim = rot, .positions = st.positions,
                                       .inv_freq = inv_freq, .attention_factor = af, .interleaved = true,
                                       .inverse = true},
                                      stream_),
                           "the outputs' inverse rope"));
  }
  // The grouped output projection: group g's heads through its block of o_a, then o_b.
  const int64_t groups = c.o_groups, r = c.o_lora_rank, in = c.o_group_in();
  if (rows == 1 && lw.o_a_table != nullptr) {  // every FP8 group in one launch (the routed form)
    RETURN_IF_ERROR(Kernel(cuda::QuantizedGemv({.format = cuda::QuantizedWeight::kFp8Block128, .x = st.o, .ldx = in,
                                                .y = st.grouped, .ldy = r, .m = 1, .n = r, .k = in,
                                                .experts = lw.o_a_table, .num_experts = static_cast<int>(groups),
                                                .ids = weights_->iota, .problems = static_cast<int>(groups),
                                                .x_group = 1},
                                               stream_),
                           "the grouped output projection"));
  } else {
    for (int64_t g = 0; g < static_cast<int64_t>(lw.o_a_groups.size()); ++g) {  // FP8 groups
      RETURN_IF_ERROR(Linear(st.o + g * in, hd, lw.o_a_groups[static_cast<size_t>(g)], st.grouped + g * r,
                             groups * r, rows));
    }
  }
  if (lw.o_a_groups.empty()) {
    TANDEM_CUBLAS_RETURN(gemm_.BatchedF32({.a = st.o, .lda = hd, .stride_a = in, .b = lw.o_a.data, .ldb = in,
                                           .stride_b = r * in, .b_transposed = true, .c = st.grouped,
                                           .ldc = groups * r, .stride_c = r, .m = rows, .n = r, .k = in,
                                           .batch = groups},
                                          stream_),
                         "the grouped output projection");
  }
  RETURN_IF_ERROR(Linear(st.grouped, groups * r, lw.o_b, st.sub, c.hidden_size, rows));
  // The ring keeps the last window of K=V rows (read above for the older positions).
  return RunCopies(sl.ring.src, sl.ring.bias, sl.ring.dst, sl.ring.rows, d, stream_, "the sliding window ring");
}

absl::Status CudaV4Model::EnqueueLogits() {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const int64_t lr = st.logits_rows, n = c.hc_mult, d = c.hidden_size;
  if (lr == 0) return absl::OkStatus();
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The rows' streams gathered into `flat`; their normalized copy (the mix's input) into
  // the streams' buffer, which the pass no longer needs.
  RETURN_IF_ERROR(RunCopies(st.logits_src, nullptr, st.logits_dst, lr, n * d, stream_, "the logits rows"));
  float* normed = st.streams;
  RETURN_IF_ERROR(Kernel(cuda::UnitRmsNorm({.x = st.flat, .x_stride = n * d, .out = normed, .out_stride = n * d,
                                            .rows = lr, .width = n * d, .eps = eps},
                                           stream_),
                         "the hyper head's norm"));
  RETURN_IF_ERROR(Linear(normed, n * d, weights_->hc_head.fn, st.mix, n, lr));
  RETURN_IF_ERROR(Kernel(cuda::HyperMix({.mix = st.mix, .mix_stride = n, .base = weights_->hc_head.base,
                                         .scale = weights_->hc_head.scale, .tokens = lr, .n = static_cast<int>(n),
                                         .sinkhorn_iters = 1, .eps = static_cast<float>(c.hc_eps), .head = true,
                                         .pre = st.pre},
                                        stream_),
                         "the hyper head's weights"));
  RETURN_IF_ERROR(Kernel(cuda::HyperCollapse({.streams = st.flat, .pre = st.pre, .tokens = lr,
                                              .n = static_cast<int>(n), .dim = d, .out = st.u, .out_stride = d},
                                             stream_),
                         "the hyper head's collapse"));
  RETURN_IF_ERROR(Kernel(cuda::RmsNorm({.x = st.u, .weight = weights_->norm, .out = st.u, .rows = lr, .dim = d,
                                        .x_stride = d, .out_stride = d, .eps = eps},
                                       stream_),
                         "the final norm"));
  return Linear(st.u, d, weights_->head, st.logits, c.vocab_size, lr);
}

absl::Status CudaV4Model::EnqueuePass() {
  Step& st = *step_;
  RETURN_IF_ERROR(RunCopies(st.embed_src, nullptr, st.embed_dst, st.rows * config_.hc_mult, config_.hidden_size,
                            stream_, "the embedding"));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) RETURN_IF_ERROR(Block(l));
  return EnqueueLogits();
}

void CudaV4Model::DropGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  graph_seen_.clear();
}

// Everything a pass's launches depend on besides what the staged arrays hold: the
// activations' and the staged arrays' places, the arrays' sizes (a compressor's closing
// windows, the copies' rows), rows and buckets. The pool's and the weights' addresses are
// fixed while the graphs live (EnsurePool drops them).
absl::Status CudaV4Model::RunGraph() {
  Step& st = *step_;
  std::vector<int64_t> key = {st.rows, st.logits_rows, st.max_keys, st.max_entries_csa,
                              static_cast<int64_t>(reinterpret_cast<uintptr_t>(st.activations.get())),
                              static_cast<int64_t>(reinterpret_cast<uintptr_t>(st.staged_base))};
  const std::vector<int64_t>& layout = st.staging.uploaded_layout();
  key.insert(key.end(), layout.begin(), layout.end());
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // The first pass of a layout runs eagerly (kernel attributes and cuBLAS set up outside
    // a capture); the second is captured.
    if (graph_seen_.size() >= 16 * kMaxGraphs) graph_seen_.clear();  // layouts seen once stay bounded
    if (graph_seen_[key]++ == 0) return EnqueuePass();
    if (graphs_.size() >= kMaxGraphs) DropGraphs();
    ASSIGN_OR_RETURN(cudaGraphExec_t exec,
                     cuda_model::CaptureGraph(stream_, [&] { return EnqueuePass(); }, "capturing a pass"));
    it = graphs_.emplace(std::move(key), exec).first;
  }
  TANDEM_CUDA_RETURN(cudaGraphLaunch(it->second, stream_), "replaying a pass");
  ++graph_replays_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaV4Model::Forward(std::span<const ForwardSequence> batch,
                                                        const ForwardOptions& options) {
  RETURN_IF_ERROR(Check(batch));
  TANDEM_CUDA_RETURN(cudaSetDevice(device_), "selecting the GPU");
  Step& st = *step_;
  // The activations first: the plan points into them.
  PassShape shape;
  for (const ForwardSequence& s : batch) {
    const int64_t n = static_cast<int64_t>(s.tokens.size()), end = s.start_position + n;
    shape.rows += n;
    shape.logits_rows += s.no_logits ? 0 : (s.all_logits ? n : 1);
    shape.max_entries_csa = std::max(shape.max_entries_csa, end / config_.compress_rate_csa);
    shape.max_entries_hca = std::max(shape.max_entries_hca, end / config_.compress_rate_hca);
  }
  RETURN_IF_ERROR(Allocate(shape));
  fp8_pass_ = fp8_gemm_on_ && shape.rows >= kFp8GemmMinRows && cuda::Fp8GemmSupported();
  if (fp8_pass_) RETURN_IF_ERROR(EnsureFp8Scratch(shape.rows));
  const StepPlan plan = BuildStepPlan(config_, *weights_, batch, *pool_, {.x_proj = st.xp, .kv = st.kv});
  RETURN_IF_ERROR(Stage(plan));
  // A pass without host round trips (every MoE layer routed on the device) can replay.
  const bool replayable = graphs_on_ && !options.after_layer_kv && weights_->experts_routed_on_device &&
                          st.rows * config_.num_experts_per_tok <= kDeviceRoutedProblems;
  RETURN_IF_ERROR(replayable ? RunGraph() : EnqueuePass());
  std::vector<float> logits(static_cast<size_t>(st.logits_rows * config_.vocab_size));
  if (!logits.empty()) {
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(logits.data(), st.logits, logits.size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_),
                       "reading the logits");
  }
  int32_t* bad = st.host_bad.get<int32_t>();
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(bad, st.bad, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
                     "reading error flags");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "running the forward pass");
  if (bad[0] != 0 || bad[1] != 0) {
    return absl::InternalError(absl::StrCat("the GPU pass refused its own plan (key lists ", bad[0], ", attention ",
                                            bad[1], "): a bug"));
  }
  if (options.after_layer_kv) {
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) options.after_layer_kv(l);
  }
  return logits;
}

}  // namespace tandem::v4::cuda_v4
