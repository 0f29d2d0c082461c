#include "engine/model/cuda/cuda_deepseek_model.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/checkpoint.h"
#include "engine/model/cuda/cuda_graph.h"
#include "engine/model/cuda/cuda_model_impl.h"
#include "engine/model/mtp_test_model.h"
#include "engine/model/weights.h"
#include "engine/util/status_macros.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/kv_gather.h"
#include "kernels/cuda/mla_decode_attention.h"
#include "kernels/cuda/moe_expert_gemv.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/small_gemv.h"
#include "kernels/cuda/token_mask.h"
#include "kernels/cuda/timestamp.h"

namespace tandem {

using cuda_model::Activations;
using cuda_model::Arena;
using cuda_model::AttentionJob;
using cuda_model::StepMeta;
using cuda_model::StepPlan;

namespace cuda_model {

StepMeta LayoutMeta(char* base, int64_t rows, int64_t out_rows, int64_t table_rows, int64_t max_blocks_per_seq,
                    size_t* bytes) {
  Arena a(base);
  StepMeta m;
  m.tokens = a.Take<int32_t>(rows);
  m.positions = a.Take<int32_t>(rows);
  m.slots = a.Take<int32_t>(rows);
  m.logit_rows = a.Take<int32_t>(out_rows);
  m.cache_lens = a.Take<int32_t>(table_rows);
  m.block_tables = a.Take<int32_t>(table_rows * max_blocks_per_seq);
  *bytes = a.used();
  return m;
}

}  // namespace cuda_model

namespace {

constexpr int64_t kBlock = 64;       // KV block size (docs/design.md §4)
constexpr int64_t kAbsorbedChunk = 64;  // query tokens per absorbed launch of a long sequence
// A verify chunk's tokens at most (a decode token and kMaxSpeculativeTokens drafts).
constexpr int64_t kMaxVerifyTokens = 17;

// Measured intervals (profile events, timeline stamps) summed per kind of launch, the
// kinds in the order they first ran.
std::vector<std::pair<std::string, double>> SumByName(const std::vector<std::pair<const char*, double>>& intervals) {
  std::vector<std::pair<std::string, double>> out;
  std::map<std::string, size_t> at;
  for (const auto& [name, ms] : intervals) {
    const auto [it, inserted] = at.try_emplace(name, out.size());
    if (inserted) out.emplace_back(name, 0.0);
    out[it->second].second += ms;
  }
  return out;
}

}  // namespace

CudaDeepseekModel::Impl::~Impl() {
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  if (launch_event_ != nullptr) cudaEventDestroy(launch_event_);
  if (side_fork_ != nullptr) cudaEventDestroy(side_fork_);
  for (int i = 0; i < kSideStreams; ++i) {
    if (side_done_[i] != nullptr) cudaEventDestroy(side_done_[i]);
    if (side_stream_[i] != nullptr) cudaStreamDestroy(side_stream_[i]);
  }
  // Buffers free themselves; the weights before the stream goes.
  weights.reset();
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status CudaDeepseekModel::Impl::Init(const ModelConfig& c, const ModelWeights* host, uint64_t seed,
                                           const LoadOptions& o, const MtpTestWeights* test) {
  config = c;
  options = o;
  if (o.batch_invariant) {
    options.small_gemm_max_rows = o.max_batch_tokens;
    options.moe_grouped_max_tokens = o.max_batch_tokens;
    options.split_activations_max_tokens = o.max_batch_tokens;
    options.fused_decode_max_tokens = 0;
    options.moe_expert_gemv = false;
    options.split_decode_queries = false;
  }
  std::vector<cuda::DeviceInfo> devices;
  const std::string why = cuda::QueryDevices(&devices);
  if (!why.empty()) return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", why));
  if (o.device < 0 || o.device >= static_cast<int>(devices.size())) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", o.device, " (", devices.size(), " present)"));
  }
  const cuda::DeviceInfo& d = devices[o.device];
  device_name = absl::StrCat("cuda:", o.device, " (", d.name, ")");
  sm_count = d.multiprocessors;
  if (d.compute_major < 9) {
    return absl::FailedPreconditionError(absl::StrCat(device_name, " has compute capability ", d.compute_major, ".",
                                                      d.compute_minor, "; the CUDA backend is built for sm_90a/sm_100a"));
  }
  // What the kernels support (mla_*_attention.h, grouped_gemm.h).
  if (c.kv_lora_rank % 32 != 0 || c.kv_lora_rank > 512 || c.qk_rope_head_dim % 16 != 0 || c.qk_rope_head_dim > 64 ||
      c.qk_nope_head_dim % 16 != 0 || c.qk_nope_head_dim > 192 || c.v_head_dim % 16 != 0 || c.v_head_dim > 192 ||
      c.hidden_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend needs kv_lora_rank a multiple of 32 up to 512, qk_rope_head_dim a multiple of 16 up to 64, "
        "qk_nope_head_dim and v_head_dim multiples of 16 up to 192, hidden_size a multiple of 8; this model has ",
        c.Summary()));
  }
  if (c.n_routed_experts > 0 && (c.n_routed_experts + c.n_shared_experts > cuda::kMoeMaxGroups ||
                                 c.n_routed_experts > 1024 || c.n_group > 32 || c.num_experts_per_tok > 32)) {
    return absl::InvalidArgumentError("the CUDA backend supports up to 1024 experts in up to 32 groups, top-k <= 32");
  }
  if (o.max_batch_tokens <= 0 || o.max_seqs <= 0) {
    return absl::InvalidArgumentError("max_batch_tokens and max_seqs must be positive");
  }
  TANDEM_CUDA_RETURN(cudaSetDevice(o.device), "selecting the GPU");
  TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a stream");
  TANDEM_CUBLAS_RETURN(gemm_.Init(), "creating the cuBLAS handle");
  if (c.n_routed_experts > 0) {
    TANDEM_CUDA_RETURN(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming), "creating an event");
    for (int i = 0; i < kSideStreams; ++i) {
      TANDEM_CUDA_RETURN(cudaStreamCreateWithFlags(&side_stream_[i], cudaStreamNonBlocking), "creating a stream");
      TANDEM_CUDA_RETURN(cudaEventCreateWithFlags(&side_done_[i], cudaEventDisableTiming), "creating an event");
      TANDEM_CUBLAS_RETURN(side_gemm_[i].Init(size_t{32} << 20), "creating a cuBLAS handle");
    }
  }
  ASSIGN_OR_RETURN(weights, cuda_model::UploadWeights(c, host, seed, stream, o.mtp, test,
                                                      /*fp8_forms=*/(o.fp8_decode || o.fp8_prefill) && !o.batch_invariant));
  kv_layers = static_cast<int64_t>(weights->layers.size());

  const std::vector<float> inv_freq = c.RopeInverseFrequencies();
  RETURN_IF_ERROR(inv_freq_.Allocate(inv_freq.size() * sizeof(float), "rotary frequencies"));
  TANDEM_CUDA_RETURN(cudaMemcpy(inv_freq_.get(), inv_freq.data(), inv_freq.size() * sizeof(float),
                                cudaMemcpyHostToDevice),
                     "uploading rotary frequencies");
  rope_attention_factor_ = static_cast<float>(c.RopeAttentionFactor());
  softmax_scale_ = static_cast<float>(c.SoftmaxScale());

  max_context = o.max_context > 0 ? o.max_context : std::min<int64_t>(c.max_position_embeddings, 32768);
  max_context = std::min<int64_t>(max_context, c.max_position_embeddings);
  max_blocks_per_seq = (max_context + kBlock - 1) / kBlock;
  max_logit_rows = o.max_logit_rows > 0 ? o.max_logit_rows : std::max<int64_t>(o.max_seqs, 256);
  max_table_rows = 3 * o.max_seqs + o.max_batch_tokens / kAbsorbedChunk + 1;
  if (c.n_routed_experts > 0) {
    groups_ = static_cast<int>(c.n_routed_experts + c.n_shared_experts);
    moe_rows_ = o.max_batch_tokens * (c.num_experts_per_tok + c.n_shared_experts);
  }
  graphs_on_ = o.cuda_graphs;
  RETURN_IF_ERROR(AllocateActivations());
  // The MTP layer's buffers before the KV cache takes what is left.
  if (weights->mtp) RETURN_IF_ERROR(AllocateMtpBuffers());
  RETURN_IF_ERROR(AllocateKvCache());
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "loading the model");
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::AllocateActivations() {
  const ModelConfig& c = config;
  const int64_t t = options.max_batch_tokens, hidden = c.hidden_size, heads = c.num_attention_heads;
  const int64_t rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  const int64_t q_rows = c.q_lora_rank ? *c.q_lora_rank : heads * qk;
  const int64_t p = moe_rows_;
  const int64_t inter = c.intermediate_size, moe_inter = c.moe_intermediate_size;

  // Decode attention scratch: the largest need over the launches a step can make.
  size_t ws = 0;
  for (int64_t s = 1; s <= options.max_seqs; s *= 2) {
    ws = std::max(ws, cuda::MlaDecodeWorkspaceBytes(static_cast<int>(s), 1, static_cast<int>(heads),
                                                    static_cast<int>(rank), static_cast<int>(max_context)));
  }
  ws = std::max(ws, cuda::MlaDecodeWorkspaceBytes(static_cast<int>(options.max_seqs), 1, static_cast<int>(heads),
                                                  static_cast<int>(rank), static_cast<int>(max_context)));
  ws = std::max(ws, cuda::MlaDecodeWorkspaceBytes(1, static_cast<int>(kAbsorbedChunk), static_cast<int>(heads),
                                                  static_cast<int>(rank), static_cast<int>(max_context)));

  auto layout = [&](char* base, Activations* a) {
    Arena ar(base);
    a->x = ar.Take<float>(t * hidden);
    a->h_f32 = ar.Take<float>(t * hidden);
    a->h_bf16 = ar.Take<__nv_bfloat16>(t * hidden);
    a->h_lo = ar.Take<__nv_bfloat16>(t * hidden);
    a->attn_lo = ar.Take<__nv_bfloat16>(t * heads * c.v_head_dim);
    a->act_lo = ar.Take<__nv_bfloat16>(std::max(t * inter, p * moe_inter));
    a->final_lo = ar.Take<__nv_bfloat16>(max_logit_rows * hidden);
    a->qkv = ar.Take<float>(t * (q_rows + rank + rope));
    if (c.q_lora_rank) {
      a->qa_bf16 = ar.Take<__nv_bfloat16>(t * *c.q_lora_rank);
      a->qa_lo = ar.Take<__nv_bfloat16>(t * *c.q_lora_rank);
      a->q_f32 = ar.Take<float>(t * heads * qk);
    }
    a->q_bf16 = ar.Take<__nv_bfloat16>(t * heads * qk);
    a->q_dec = ar.Take<__nv_bfloat16>(t * heads * (rank + rope));
    a->q_dec_lo = ar.Take<__nv_bfloat16>(t * heads * (rank + rope));
    a->lat_out = ar.Take<float>(t * heads * rank);
    a->lat_bf16 = ar.Take<__nv_bfloat16>(t * heads * rank);
    a->attn_f32 = ar.Take<float>(t * heads * c.v_head_dim);
    a->attn_bf16 = ar.Take<__nv_bfloat16>(t * heads * c.v_head_dim);
    a->kv_gathered = ar.Take<__nv_bfloat16>(max_context * (rank + rope));
    a->kv_expanded = ar.Take<__nv_bfloat16>(max_context * heads * (c.qk_nope_head_dim + c.v_head_dim));
    a->decode_ws = ar.Take<char>(ws);
    a->decode_ws_bytes = ws;
    a->gu = ar.Take<float>(std::max(t * 2 * inter, p * 2 * moe_inter));
    a->act_bf16 = ar.Take<__nv_bfloat16>(std::max(t * inter, p * moe_inter));
    if (groups_ > 0) {
      a->router_logits = ar.Take<float>(t * c.n_routed_experts);
      a->expert_ids = ar.Take<int32_t>(t * c.num_experts_per_tok);
      a->expert_weights = ar.Take<float>(t * c.num_experts_per_tok);
      a->group_offsets = ar.Take<int32_t>(kv_layers * (groups_ + 1));
      a->active_groups = ar.Take<int32_t>(groups_);
      a->num_active = ar.Take<int32_t>(1);
      a->tile_group = ar.Take<int32_t>(cuda::MoeMaxTiles(p, groups_, 16));
      a->tile_row = ar.Take<int32_t>(cuda::MoeMaxTiles(p, groups_, 16));
      a->num_tiles = ar.Take<int32_t>(1);
      a->sorted_token = ar.Take<int32_t>(p);
      a->sorted_weight = ar.Take<float>(p);
      a->entry_row = ar.Take<int32_t>(p);
      a->permute_scratch = ar.Take<int32_t>(cuda::MoePermuteScratchInts(groups_));
      a->perm_bf16 = ar.Take<__nv_bfloat16>(p * hidden);
      a->y = ar.Take<float>(p * hidden);
      a->route_counter = ar.Take<uint32_t>(1);
      a->down_tile_counters = ar.Take<uint32_t>(hidden / 16 + 1);
    }
    a->logits = ar.Take<float>(max_logit_rows * c.vocab_size);
    a->argmax = ar.Take<int32_t>(max_logit_rows);
    a->final_bf16 = ar.Take<__nv_bfloat16>(max_logit_rows * hidden);
    a->dense_plan = ar.Take<cuda_model::DenseMlpPlan>(1);
    if (weights->fp8_linears > 0) a->act_f32 = ar.Take<float>(cuda::kSmallGemvMaxRows * std::max<int64_t>(inter, 1));
    if (weights->fp8_linears > 0 && options.fp8_prefill && cuda::Fp8GemmSupported()) {
      // The FP8 GEMMs' quantized activations: as wide as any input they take.
      // The MoE layers' expert rows too (p of them, moe_inter wide at most after gate_up).
      const int64_t widest = std::max({hidden, c.q_lora_rank.value_or(0), heads * c.v_head_dim, inter, moe_inter});
      a->x_fp8_rows = std::max(t, p);
      a->x_fp8 = ar.Take<uint8_t>(a->x_fp8_rows * widest);
      a->x_fp8_scales = ar.Take<float>(a->x_fp8_rows * ((widest + 127) / 128));
    }
    a->argmax_scratch = ar.Take<char>(cuda::SmallGemvArgmaxScratchBytes());
    a->argmax_counter = ar.Take<uint32_t>(1);
    return ar.used();
  };
  Activations sizing;
  const size_t bytes = layout(nullptr, &sizing);
  RETURN_IF_ERROR(act_buffer_.Allocate(bytes, "activations"));
  layout(act_buffer_.get<char>(), &act_);
  activation_bytes = bytes;
  {
    cuda_model::DenseMlpPlan plan;
    for (int32_t m = 0; m < cuda::kMoeExpertGemvMaxRows; ++m) plan.rows[m] = m;
    for (int32_t t = 0; t <= cuda::kMoeExpertGemvMaxRows; ++t) {
      plan.offsets[t][0] = 0;
      plan.offsets[t][1] = t;
    }
    TANDEM_CUDA_RETURN(cudaMemcpy(act_.dense_plan, &plan, sizeof(plan), cudaMemcpyHostToDevice), "dense MLP plan");
    TANDEM_CUDA_RETURN(cudaMemset(act_.argmax_counter, 0, sizeof(uint32_t)), "clearing the arg-max counter");
  }
  if (groups_ > 0) {
    TANDEM_CUDA_RETURN(cudaMemset(act_.group_offsets, 0, kv_layers * (groups_ + 1) * sizeof(int32_t)),
                       "clearing expert offsets");
    TANDEM_CUDA_RETURN(cudaMemset(act_.route_counter, 0, sizeof(uint32_t)), "clearing the routing counter");
    TANDEM_CUDA_RETURN(cudaMemset(act_.down_tile_counters, 0, (c.hidden_size / 16 + 1) * sizeof(uint32_t)),
                       "clearing the down projection's tile counters");
  }

  size_t meta_bytes = 0;
  cuda_model::LayoutMeta(nullptr, t, t, max_table_rows, max_blocks_per_seq, &meta_bytes);
  RETURN_IF_ERROR(meta_dev_.Allocate(meta_bytes, "step metadata"));
  RETURN_IF_ERROR(meta_host_.Allocate(meta_bytes, "step metadata"));
  RETURN_IF_ERROR(logits_host_.Allocate(max_logit_rows * c.vocab_size * sizeof(float), "logits"));
  RETURN_IF_ERROR(small_host_.Allocate(
      std::max<size_t>(kv_layers * (groups_ + 1), max_logit_rows) * sizeof(int32_t) + 256, "offsets"));
  RETURN_IF_ERROR(argmax_host_.Allocate(cuda::kSmallGemvMaxRows * sizeof(int32_t), "greedy tokens"));
  if (void* dev = nullptr; cudaHostGetDevicePointer(&dev, argmax_host_.get(), 0) == cudaSuccess) {
    argmax_host_dev_ = static_cast<int32_t*>(dev);
  } else {
    cudaGetLastError();  // not mapped: the tokens are copied
  }
  kv_staging_entries_ = 64 * kBlock;
  const size_t staging = kv_staging_entries_ * c.kv_entry_dim() * sizeof(float);
  RETURN_IF_ERROR(kv_staging_.Allocate(staging + (max_blocks_per_seq + kv_staging_entries_) * sizeof(int32_t) + 512,
                                       "KV staging"));
  RETURN_IF_ERROR(kv_staging_host_.Allocate(staging, "KV staging"));
  activation_bytes += meta_bytes + kv_staging_.bytes();
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::AllocateKvCache() {
  const uint64_t block_bytes = static_cast<uint64_t>(kv_layers) * kBlock * config.kv_entry_dim() * 2;
  int64_t blocks = options.kv_blocks;
  if (blocks <= 0) {
    size_t free = 0, total = 0;
    TANDEM_CUDA_RETURN(cudaMemGetInfo(&free, &total), "querying GPU memory");
    // This process's share of the GPU (several replicas may share one, each with its own
    // fraction, as in vLLM): what it already holds counts against it, other processes'
    // memory only through what is free. The reserve covers the CUDA context, cuBLAS's
    // workspace and captured graphs, which cudaMalloc does not see.
    constexpr double kReserve = 1 << 30;
    const double own = static_cast<double>(weights->bytes + activation_bytes);
    const double budget = std::min(options.gpu_memory_utilization * static_cast<double>(total) - own - kReserve,
                                   static_cast<double>(free) - kReserve);
    blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    if (blocks <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no GPU memory left for the KV cache at gpu_memory_utilization ", options.gpu_memory_utilization, " (",
          weights->bytes, " bytes of weights, ", activation_bytes, " of activations, ", free, " free of ", total, ")"));
    }
  }
  if (blocks * kBlock > 0x7fffffff) blocks = 0x7fffffff / kBlock;
  RETURN_IF_ERROR(kv_cache_.Allocate(blocks * block_bytes, "the KV cache"));
  TANDEM_CUDA_RETURN(cudaMemsetAsync(kv_cache_.get(), 0, blocks * block_bytes, stream), "clearing the KV cache");
  num_blocks = blocks;
  kv_bytes = blocks * block_bytes;
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> CudaDeepseekModel::Impl::Plan(std::span<const ForwardSequence> batch, AttentionForm form) {
  const ModelConfig& c = config;
  if (static_cast<int64_t>(batch.size()) > options.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", batch.size(), " sequences exceeds max_seqs ",
                                                   options.max_seqs));
  }
  int64_t rows = 0, out_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has no new tokens"));
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if ((s.mtp || s.keep_hidden) && !weights->mtp) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", i, " asks for the MTP layer, which this model was loaded without"));
    }
    if (s.mtp && s.mtp_next_token >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", s.mtp_next_token,
                                                     " is outside the vocabulary (size ", c.vocab_size, ")"));
    }
    // The MTP pass writes slot `end` when it knows the token there.
    const int64_t end = s.start_position + n + (s.mtp && s.mtp_next_token >= 0 ? 1 : 0);
    if (s.start_position < 0 || end > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " reaches position ", end,
                                                     ", beyond max_position_embeddings ", c.max_position_embeddings));
    }
    if (end > max_context) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " reaches position ", end,
                                                     ", beyond the CUDA model's max_context ", max_context));
    }
    if (static_cast<int64_t>(s.block_table.size()) * kBlock < end) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", s.block_table.size(),
                                                     " cache blocks cannot hold ", end, " tokens"));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": block id ", b, " out of range"));
      }
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary (size ",
                                                       c.vocab_size, ")"));
      }
    }
    rows += n;
    if (!s.no_logits) out_rows += s.all_logits ? n : 1;
  }
  if (rows > options.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " tokens exceeds max_batch_tokens ",
                                                   options.max_batch_tokens));
  }

  // Single decode tokens first (one absorbed launch for all), then the others in order.
  auto in_decode_group = [&](const ForwardSequence& s) {
    return s.tokens.size() == 1 && form != AttentionForm::kExpanded;
  };
  auto absorbed = [&](const ForwardSequence& s) {
    return form == AttentionForm::kAbsorbed || options.batch_invariant ||
           (form == AttentionForm::kAuto && AutoAbsorbed(static_cast<int64_t>(s.tokens.size()), s.start_position));
  };
  // Speculative decoding's verify chunks (a decode token and its drafts, every one's
  // logits: a few tokens) of one length share an absorbed launch of that many queries per
  // sequence, after the decode group: never the expanded form over the whole context.
  auto verify_length = [&](const ForwardSequence& s) -> int64_t {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    return s.all_logits && n > 1 && n <= kMaxVerifyTokens && form != AttentionForm::kExpanded ? n : 0;
  };
  std::vector<size_t> order;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (in_decode_group(batch[i])) order.push_back(i);
  }
  const int64_t num_decode = static_cast<int64_t>(order.size());
  int64_t table_rows = num_decode;
  for (int64_t n = 2; n <= kMaxVerifyTokens; ++n) {
    for (size_t i = 0; i < batch.size(); ++i) {
      if (verify_length(batch[i]) != n) continue;
      order.push_back(i);
      ++table_rows;
    }
  }
  const size_t decode_and_verify = order.size();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (in_decode_group(batch[i]) || verify_length(batch[i]) > 0) continue;
    order.push_back(i);
    const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
    table_rows += absorbed(batch[i]) ? (n + kAbsorbedChunk - 1) / kAbsorbedChunk : 1;
  }
  if (table_rows > max_table_rows) return absl::InvalidArgumentError("batch needs too many attention launches");

  StepPlan plan;
  plan.rows = rows;
  plan.out_rows = out_rows;
  plan.table_rows = table_rows;
  plan.meta = cuda_model::LayoutMeta(meta_dev_.get<char>(), rows, out_rows, table_rows, max_blocks_per_seq,
                                     &plan.meta_bytes);
  size_t unused = 0;
  const StepMeta host = cuda_model::LayoutMeta(meta_host_.get<char>(), rows, out_rows, table_rows,
                                               max_blocks_per_seq, &unused);
  auto put_table = [&](int64_t row, const ForwardSequence& s, int64_t len) {
    const int64_t blocks = (s.start_position + static_cast<int64_t>(s.tokens.size()) + kBlock - 1) / kBlock;
    std::memcpy(host.block_tables + row * max_blocks_per_seq, s.block_table.data(), blocks * sizeof(int32_t));
    host.cache_lens[row] = static_cast<int32_t>(len);
  };

  std::vector<int64_t> row_of(batch.size());
  int64_t r = 0, table_row = 0, max_decode_len = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t idx = order[k];
    const ForwardSequence& s = batch[idx];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    row_of[idx] = r;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = s.start_position + j;
      host.tokens[r + j] = s.tokens[j];
      host.positions[r + j] = static_cast<int32_t>(pos);
      host.slots[r + j] = static_cast<int32_t>(s.block_table[pos / kBlock] * kBlock + pos % kBlock);
    }
    // A recomputed cached position (first_kv_cached) writes no KV: slot -1.
    if (s.first_kv_cached) host.slots[r] = -1;
    if (in_decode_group(s)) {
      put_table(table_row++, s, s.start_position + 1);
      max_decode_len = std::max(max_decode_len, s.start_position + 1);
    } else if (k < decode_and_verify) {
      // A verify group: one job for the run of sequences of this length.
      const int64_t len = s.start_position + n;
      put_table(table_row, s, len);
      AttentionJob* job = plan.jobs.empty() ? nullptr : &plan.jobs.back();
      if (job != nullptr && job->absorbed && job->q_per_seq == n && job->num_seqs > 0 &&
          job->table_row + job->num_seqs == table_row && job->row_begin + job->num_seqs * n == r) {
        ++job->num_seqs;
        job->max_cache_len = std::max(job->max_cache_len, len);
      } else {
        plan.jobs.push_back({.absorbed = true, .row_begin = r, .num_seqs = 1, .q_per_seq = n, .table_row = table_row,
                             .max_cache_len = len});
      }
      ++table_row;
    } else if (absorbed(s)) {
      for (int64_t c0 = 0; c0 < n; c0 += kAbsorbedChunk) {
        const int64_t m = std::min(kAbsorbedChunk, n - c0);
        const int64_t len = s.start_position + c0 + m;
        put_table(table_row, s, len);
        plan.jobs.push_back({.absorbed = true, .row_begin = r + c0, .num_seqs = 1, .q_per_seq = m,
                             .table_row = table_row, .max_cache_len = len});
        ++table_row;
      }
    } else {
      put_table(table_row, s, s.start_position + n);
      plan.jobs.push_back({.absorbed = false, .row_begin = r, .num_seqs = 1, .q_per_seq = n, .table_row = table_row,
                           .max_cache_len = s.start_position + n});
      ++table_row;
    }
    r += n;
  }
  if (num_decode > 0) {
    plan.jobs.insert(plan.jobs.begin(), AttentionJob{.absorbed = true, .row_begin = 0, .num_seqs = num_decode,
                                                     .q_per_seq = 1, .table_row = 0,
                                                     .max_cache_len = max_decode_len});
  }
  int64_t o = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    if (s.no_logits) continue;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (s.all_logits) {
      for (int64_t j = 0; j < n; ++j) host.logit_rows[o++] = static_cast<int32_t>(row_of[i] + j);
    } else {
      host.logit_rows[o++] = static_cast<int32_t>(row_of[i] + n - 1);
    }
  }
  for (const AttentionJob& j : plan.jobs) {
    if (j.absorbed) plan.rope_out_rows = std::max(plan.rope_out_rows, j.row_begin + j.num_seqs * j.q_per_seq);
  }
  // Decode tokens and verify chunks alone, every row's logits: the step a CUDA graph and
  // the fused small-batch kernels take (with one attention job).
  plan.decode_only = decode_and_verify == batch.size() && out_rows == rows;
  plan.seq_rows = std::move(row_of);
  return plan;
}

bool CudaDeepseekModel::Impl::AutoAbsorbed(int64_t n, int64_t start) const {
  return n > 1 && SplitQueries() && config.AbsorbedAttentionCheaper(n, start);
}

void CudaDeepseekModel::Impl::DropGraphs() {
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  graph_seen_.clear();
}

absl::Status CudaDeepseekModel::Impl::EnqueueSample(std::span<const CudaDeepseekModel::SampleRow> rows, int64_t begin,
                                                    int64_t count) {
  const int64_t vocab = config.vocab_size;
  std::vector<cuda::SampleRowParams> params(static_cast<size_t>(count));
  std::vector<cuda::PenaltyEntry> penalties;
  for (int64_t i = 0; i < count; ++i) {
    const CudaDeepseekModel::SampleRow& r = rows[begin + i];
    for (const std::span<const int32_t> tokens : {r.prompt_tokens, r.output_tokens}) {
      for (const int32_t id : tokens) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("sampling history token id ", id, " is outside the vocabulary"));
        }
      }
    }
    cuda::SampleRowParams& p = params[i];
    p = {.temperature = r.temperature, .top_p = r.top_p, .top_k = r.top_k, .min_p = r.min_p,
         .repetition_penalty = r.repetition_penalty, .presence_penalty = r.presence_penalty,
         .frequency_penalty = r.frequency_penalty, .seed = r.seed, .step = r.step};
    const bool penalized = r.repetition_penalty != 1.0f || r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f;
    if (penalized) {
      p.penalty_begin = static_cast<int32_t>(penalties.size());
      cuda::AppendPenaltyEntries(r.prompt_tokens.data(), r.prompt_tokens.size(), r.output_tokens.data(),
                                 r.output_tokens.size(), &penalties);
      p.penalty_count = static_cast<int32_t>(penalties.size()) - p.penalty_begin;
    }
  }
  // Structured output: each masked row's bitmask, after the penalties (token_mask.h).
  std::vector<int32_t> slots(static_cast<size_t>(count), -1);
  size_t words = 0;
  int32_t num_masks = 0;
  for (int64_t i = 0; i < count; ++i) {
    const std::span<const uint32_t> m = rows[begin + i].allowed;
    if (m.empty()) continue;
    if (words != 0 && m.size() != words) return absl::InvalidArgumentError("token masks of different sizes in one step");
    words = m.size();
    slots[i] = num_masks++;
  }
  auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t param_bytes = aligned(params.size() * sizeof(cuda::SampleRowParams));
  const size_t penalty_bytes = aligned(penalties.size() * sizeof(cuda::PenaltyEntry));
  const size_t slot_bytes = num_masks > 0 ? aligned(slots.size() * sizeof(int32_t)) : 0;
  const size_t mask_bytes = static_cast<size_t>(num_masks) * words * sizeof(uint32_t);
  const size_t bytes = param_bytes + penalty_bytes + slot_bytes + mask_bytes;
  // The previous step's upload may still be in flight: buffers are reused only after a
  // synchronization (Run synchronizes at its end), so growing here is safe.
  if (sample_host_.bytes() < bytes) {
    RETURN_IF_ERROR(sample_host_.Allocate(bytes * 2, "sampling parameters"));
    RETURN_IF_ERROR(sample_dev_.Allocate(bytes * 2, "sampling parameters"));
  }
  std::memcpy(sample_host_.get(), params.data(), params.size() * sizeof(cuda::SampleRowParams));
  if (!penalties.empty()) {
    std::memcpy(sample_host_.get<char>() + param_bytes, penalties.data(),
                penalties.size() * sizeof(cuda::PenaltyEntry));
  }
  const size_t slot_at = param_bytes + penalty_bytes;
  if (num_masks > 0) {
    std::memcpy(sample_host_.get<char>() + slot_at, slots.data(), slots.size() * sizeof(int32_t));
    for (int64_t i = 0; i < count; ++i) {
      if (slots[i] < 0) continue;
      std::memcpy(sample_host_.get<char>() + slot_at + slot_bytes + static_cast<size_t>(slots[i]) * words * 4,
                  rows[begin + i].allowed.data(), words * sizeof(uint32_t));
    }
  }
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(sample_dev_.get(), sample_host_.get(), bytes, cudaMemcpyHostToDevice, stream),
                     "uploading sampling parameters");
  if (num_masks > 0) {
    TANDEM_CUDA_RETURN(
        cuda::ApplyTokenMasks({.logits = act_.logits, .stride = vocab, .rows = static_cast<int>(count),
                               .vocab = static_cast<int>(vocab),
                               .row_slot = reinterpret_cast<const int32_t*>(sample_dev_.get<char>() + slot_at),
                               .masks = reinterpret_cast<const uint32_t*>(sample_dev_.get<char>() + slot_at + slot_bytes),
                               .words = static_cast<int>(words)},
                              stream),
        "masking constrained rows");
  }
  TANDEM_CUDA_RETURN(
      cuda::SampleTokens({.logits = act_.logits, .stride = vocab, .rows = static_cast<int>(count),
                          .vocab = static_cast<int>(vocab),
                          .row_params = sample_dev_.get<cuda::SampleRowParams>(),
                          .penalties = penalties.empty()
                                           ? nullptr
                                           : reinterpret_cast<const cuda::PenaltyEntry*>(sample_dev_.get<char>() +
                                                                                         param_bytes),
                          .out = act_.argmax},
                         stream),
      "sampling");
  return Mark("sampling");
}

namespace {

// Rows that all take the argmax of unpenalized logits: the LM head's fused arg-max gives
// the sampler kernel's token (the first maximum, the same float logits) without the
// sampling launch and its parameter upload.
bool AllGreedy(std::span<const CudaDeepseekModel::SampleRow> rows) {
  for (const CudaDeepseekModel::SampleRow& r : rows) {
    if (!(r.temperature < cuda::kSampleGreedyTemperature) || r.repetition_penalty != 1.0f ||
        r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f || !r.allowed.empty()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status CudaDeepseekModel::Impl::Run(std::span<const ForwardSequence> batch, const DeepseekForwardOptions& fo,
                                          std::vector<float>* logits, std::vector<int32_t>* ids,
                                          std::span<const CudaDeepseekModel::SampleRow> sample, bool launch) {
  TANDEM_CUDA_RETURN(cudaSetDevice(options.device), "selecting the GPU");
  ASSIGN_OR_RETURN(StepPlan plan, Plan(batch, fo.attention));
  const bool mtp = std::any_of(batch.begin(), batch.end(),
                               [](const ForwardSequence& s) { return s.mtp || s.keep_hidden; });
  if (mtp && launch) return absl::InvalidArgumentError("a step with the MTP layer cannot be launched pipelined");
  if (!sample.empty() && static_cast<int64_t>(sample.size()) != plan.out_rows) {
    return absl::InvalidArgumentError(absl::StrCat(sample.size(), " sampling rows for ", plan.out_rows,
                                                   " logits rows"));
  }
  if (AllGreedy(sample)) sample = {};  // the LM head's arg-max
  last_rows_ = plan.rows;
  last_out_rows_ = plan.out_rows;
  last_fp8_ = Fp8Decode(plan);
  if (step_events_) {
    step_begin_.push_back(NextEvent());
    TANDEM_CUDA_RETURN(cudaEventRecord(step_begin_.back(), stream), "recording a step event");
  }
  stamp_names_.clear();
  RETURN_IF_ERROR(Mark("step begin (host)"));
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(meta_dev_.get(), meta_host_.get(), plan.meta_bytes, cudaMemcpyHostToDevice, stream),
                     "uploading the step");
  const bool graph = graphs_on_ && !profiling_ && !timeline_ && plan.decode_only && plan.jobs.size() == 1 &&
                     !fo.after_layer_kv &&
                     (groups_ == 0 || plan.rows <= options.moe_grouped_max_tokens) &&
                     plan.out_rows <= max_logit_rows;
  if (graph) {
    RETURN_IF_ERROR(RunGraph(plan, fo));
  } else {
    RETURN_IF_ERROR(EnqueueStep(plan, fo));
  }

  // The forward pass is on the stream: the host fills the rows' masks while it computes.
  if (fo.before_sampling) fo.before_sampling();
  const int64_t vocab = config.vocab_size;
  if (logits != nullptr) logits->resize(static_cast<size_t>(plan.out_rows * vocab));
  if (ids != nullptr) ids->resize(static_cast<size_t>(plan.out_rows));
  for (int64_t begin = 0; begin < plan.out_rows; begin += max_logit_rows) {
    const int64_t count = std::min(max_logit_rows, plan.out_rows - begin);
    if (begin > 0) RETURN_IF_ERROR(EnqueueLogits(plan, begin, count));
    if (!sample.empty()) RETURN_IF_ERROR(EnqueueSample(sample, begin, count));
    // The chunk's results on the host: greedy tokens the LM head wrote there itself, else
    // tokens or logits copied after the step.
    const bool tokens = ids != nullptr;
    const size_t bytes = tokens ? count * sizeof(int32_t) : count * vocab * sizeof(float);
    const void* host = argmax_host_.get();
    if (!tokens || !sample.empty() || !ArgmaxToHost(begin, count)) {
      void* dst = tokens ? small_host_.get() : logits_host_.get();
      const void* src = tokens ? static_cast<const void*>(act_.argmax) : static_cast<const void*>(act_.logits);
      TANDEM_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                         tokens ? "reading tokens" : "reading logits");
      host = dst;
    }
    RETURN_IF_ERROR(RecordStepEnd(begin + count == plan.out_rows));
    if (launch && tokens && count == plan.out_rows) {
      // One pass: the tokens are read when collected (the host buffers are not touched
      // again before then: the next launch comes after the collection).
      if (launch_event_ == nullptr) {
        TANDEM_CUDA_RETURN(cudaEventCreateWithFlags(&launch_event_, cudaEventDisableTiming), "creating an event");
      }
      TANDEM_CUDA_RETURN(cudaEventRecord(launch_event_, stream), "recording the step's end");
      launched_ = Launched{.done = launch_event_, .host = host, .count = count};
      return absl::OkStatus();
    }
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "running the forward pass");
    void* out = tokens ? static_cast<void*>(ids->data() + begin) : static_cast<void*>(logits->data() + begin * vocab);
    std::memcpy(out, host, bytes);
  }
  if (plan.out_rows == 0) RETURN_IF_ERROR(RecordStepEnd(true));
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "running the forward pass");
  // The logits are out: the MTP layer may take the activations over.
  if (mtp) RETURN_IF_ERROR(MtpAfterForward(batch, plan, fo));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaDeepseekModel::Impl::CollectLaunched() {
  if (!launched_) return absl::FailedPreconditionError("no step launched");
  Launched l = std::move(*launched_);
  launched_.reset();
  if (l.done == nullptr) return std::move(l.tokens);
  TANDEM_CUDA_RETURN(cudaEventSynchronize(l.done), "running the forward pass");
  std::vector<int32_t> ids(static_cast<size_t>(l.count));
  std::memcpy(ids.data(), l.host, ids.size() * sizeof(int32_t));
  return ids;
}

cudaEvent_t CudaDeepseekModel::Impl::NextEvent() {
  if (events_used_ == event_pool_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    event_pool_.push_back(e);
  }
  return event_pool_[events_used_++];
}

absl::Status CudaDeepseekModel::Impl::Mark(const char* what) {
  if (timeline_ && stamp_names_.size() < kMaxStamps) {
    if (stamps_.get<uint64_t>() == nullptr) {
      RETURN_IF_ERROR(stamps_.Allocate(kMaxStamps * sizeof(uint64_t), "kernel timeline stamps"));
    }
    stamp_names_.push_back(what);
    TANDEM_CUDA_RETURN(cuda::RecordTimestamp(stamps_.get<uint64_t>() + stamp_names_.size() - 1, stream),
                       "recording a timestamp");
  }
  if (!profiling_) return absl::OkStatus();
  cudaEvent_t e = NextEvent();
  if (e == nullptr) return absl::InternalError("cannot create a CUDA event");
  marks_.emplace_back(what, e);
  return cuda_model::CudaStatus(cudaEventRecord(e, stream), "recording a profile event");
}

absl::Status CudaDeepseekModel::Impl::RecordStepEnd(bool last) {
  if (!last) return absl::OkStatus();
  RETURN_IF_ERROR(Mark("results to host"));
  if (!step_events_) return absl::OkStatus();
  cudaEvent_t e = NextEvent();
  if (e == nullptr) return absl::InternalError("cannot create a CUDA event");
  step_end_.push_back(e);
  return cuda_model::CudaStatus(cudaEventRecord(e, stream), "recording a step event");
}

absl::StatusOr<std::vector<std::pair<double, double>>> CudaDeepseekModel::Impl::TakeStepTimes() {
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading step events");
  std::vector<std::pair<double, double>> times;
  for (size_t i = 0; i < step_begin_.size() && i < step_end_.size(); ++i) {
    float b = 0, e = 0;
    TANDEM_CUDA_RETURN(cudaEventElapsedTime(&b, step_begin_[0], step_begin_[i]), "reading step events");
    TANDEM_CUDA_RETURN(cudaEventElapsedTime(&e, step_begin_[0], step_end_[i]), "reading step events");
    times.emplace_back(b, e);
  }
  step_begin_.clear();
  step_end_.clear();
  if (marks_.empty()) events_used_ = 0;
  return times;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaDeepseekModel::Impl::TakeProfile() {
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading profile events");
  std::vector<std::pair<const char*, double>> intervals;
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    TANDEM_CUDA_RETURN(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second), "reading profile events");
    intervals.emplace_back(marks_[i].first, ms);
  }
  marks_.clear();
  if (step_begin_.empty() && step_end_.empty()) events_used_ = 0;
  return SumByName(intervals);
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaDeepseekModel::Impl::TakeKernelTimeline() {
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading the kernel timeline");
  std::vector<uint64_t> t(stamp_names_.size());
  if (!t.empty()) {
    TANDEM_CUDA_RETURN(cudaMemcpy(t.data(), stamps_.get<uint64_t>(), t.size() * sizeof(uint64_t),
                                  cudaMemcpyDeviceToHost),
                       "reading the kernel timeline");
  }
  std::vector<std::pair<const char*, double>> intervals;
  for (size_t i = 1; i < t.size(); ++i) intervals.emplace_back(stamp_names_[i], static_cast<double>(t[i] - t[i - 1]) * 1e-6);
  return SumByName(intervals);
}

absl::Status CudaDeepseekModel::Impl::RunGraph(const StepPlan& plan, const DeepseekForwardOptions& fo) {
  // Context bucket: the decode launch's grid is sized for it, so one graph serves every
  // step whose longest sequence fits.
  StepPlan p = plan;
  AttentionJob& job = p.jobs.front();
  int64_t bucket = 256;
  while (bucket < job.max_cache_len) bucket *= 2;
  bucket = std::min(bucket, max_context);
  job.max_cache_len = bucket;
  // (A verify step's queries per sequence shape its launches too.)
  const std::tuple<int64_t, int64_t, int64_t> key{plan.rows, bucket, job.q_per_seq};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // The first step of a shape runs eagerly (warms cuBLAS and kernel attributes); the
    // second is captured.
    if (graph_seen_[key]++ == 0) return EnqueueStep(p, fo);
    ASSIGN_OR_RETURN(cudaGraphExec_t exec, cuda_model::CaptureGraph(
                                               stream, [&] { return EnqueueStep(p, fo); }, "capturing a decode step"));
    it = graphs_.emplace(key, exec).first;
  }
  TANDEM_CUDA_RETURN(cudaGraphLaunch(it->second, stream), "replaying a decode step");
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::ReadKv(int64_t layer, std::span<const int32_t> table, int64_t first, int64_t n,
                                             float* host) {
  const int64_t entry = config.kv_entry_dim();
  float* staging = kv_staging_.get<float>();
  int32_t* dev_table = reinterpret_cast<int32_t*>(kv_staging_.get<char>() + kv_staging_entries_ * entry * 4);
  const int64_t blocks = (first + n + kBlock - 1) / kBlock;
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(dev_table, table.data(), blocks * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                     "uploading a block table");
  for (int64_t done = 0; done < n; done += kv_staging_entries_) {
    const int64_t count = std::min(kv_staging_entries_, n - done);
    TANDEM_CUDA_RETURN(cuda::KvGather({.kv_cache = KvLayer(layer), .block_table = dev_table, .block_size = kBlock,
                                       .entry_dim = static_cast<int>(entry), .first_position = first + done,
                                       .num_positions = count, .out_f32 = staging, .out_stride = entry},
                                      stream),
                       "reading KV entries");
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(kv_staging_host_.get(), staging, count * entry * 4, cudaMemcpyDeviceToHost,
                                       stream),
                       "reading KV entries");
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading KV entries");
    std::memcpy(host + done * entry, kv_staging_host_.get(), count * entry * 4);
  }
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::Impl::WriteKv(int64_t layer, std::span<const int32_t> table, int64_t first,
                                              const float* entries, int64_t n) {
  const int64_t entry = config.kv_entry_dim();
  float* staging = kv_staging_.get<float>();
  int32_t* dev_slots = reinterpret_cast<int32_t*>(kv_staging_.get<char>() + kv_staging_entries_ * entry * 4);
  std::vector<int32_t> slots(static_cast<size_t>(kv_staging_entries_));
  for (int64_t done = 0; done < n; done += kv_staging_entries_) {
    const int64_t count = std::min(kv_staging_entries_, n - done);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = first + done + i;
      slots[i] = static_cast<int32_t>(table[pos / kBlock] * kBlock + pos % kBlock);
    }
    std::memcpy(kv_staging_host_.get(), entries + done * entry, count * entry * 4);
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(staging, kv_staging_host_.get(), count * entry * 4, cudaMemcpyHostToDevice,
                                       stream),
                       "writing KV entries");
    TANDEM_CUDA_RETURN(cudaMemcpyAsync(dev_slots, slots.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       stream),
                       "writing KV entries");
    TANDEM_CUDA_RETURN(cuda::KvCacheWrite({.entries = staging, .entries_stride = entry, .slots = dev_slots,
                                           .num_tokens = static_cast<int>(count), .entry_dim = static_cast<int>(entry),
                                           .kv_cache = KvLayer(layer), .num_slots = num_blocks * kBlock},
                                          stream),
                       "writing KV entries");
    // The staging buffers are reused by the next chunk.
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "writing KV entries");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaDeepseekModel::Impl::LastForwardWeightBytes() {
  const ModelConfig& c = config;
  const cuda_model::CudaModelWeights& w = *weights;
  uint64_t bytes = static_cast<uint64_t>(last_rows_) * c.hidden_size * 2;  // embedding rows
  std::vector<int32_t> offsets;
  if (groups_ > 0) {
    offsets.resize(static_cast<size_t>(c.num_hidden_layers * (groups_ + 1)));
    TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream), "reading expert counts");
    TANDEM_CUDA_RETURN(cudaMemcpy(offsets.data(), act_.group_offsets, offsets.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost),
                       "reading expert counts");
  }
  // A linear's bytes as the last step read it: its FP8 form (codes and scales) on an FP8
  // step where it has one, else its bf16 copy.
  const auto linear = [&](const cuda_model::DeviceMatrix& bf16, const cuda_model::Fp8Linear& fp8) -> uint64_t {
    if (!last_fp8_ || !fp8.present()) return bf16.bytes();
    uint64_t b = 0;
    for (const cuda_model::Fp8Matrix& m : fp8.parts) {
      b += static_cast<uint64_t>(m.rows * m.cols + ((m.rows + 127) / 128) * ((m.cols + 127) / 128) * 4);
    }
    return b;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const cuda_model::CudaLayerWeights& layer = w.layers[l];
    const cuda_model::CudaAttentionWeights& a = layer.attention;
    bytes += 2 * c.hidden_size * 4 + c.kv_lora_rank * 4;  // norms
    bytes += linear(a.qkv_a, a.qkv_a_fp8) + linear(a.q_b, a.q_b_fp8) + a.kv_b.bytes() + linear(a.o_proj, a.o_proj_fp8);
    if (layer.mlp) bytes += linear(layer.mlp->gate_up, layer.mlp->gate_up_fp8) + linear(layer.mlp->down, layer.mlp->down_fp8);
    if (layer.moe) {
      const cuda_model::CudaMoeWeights& m = *layer.moe;
      bytes += static_cast<uint64_t>(c.n_routed_experts) * c.hidden_size * 4;
      // An expert's FP8 form: codes and the scales of gate_up and down.
      const uint64_t fp8_expert = static_cast<uint64_t>(3 * m.inter * c.hidden_size) +
                                  4 * static_cast<uint64_t>((3 * m.inter / 128) * ((c.hidden_size + 127) / 128));
      const int32_t* off = &offsets[l * (groups_ + 1)];
      for (int g = 0; g < groups_; ++g) {
        if (off[g + 1] > off[g]) {
          bytes += last_fp8_ && m.fp8 ? fp8_expert : static_cast<uint64_t>(3 * m.inter * c.hidden_size) * 2;
        }
      }
    }
  }
  if (last_out_rows_ > 0) bytes += w.lm_head.bytes() + c.hidden_size * 4;
  return bytes;
}

// ---------------------------------------------------------------------------------------

CudaDeepseekModel::CudaDeepseekModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaDeepseekModel::~CudaDeepseekModel() = default;

absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> CudaDeepseekModel::Load(const std::string& dir,
                                                                           const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedWeights> loaded, LoadedWeights::Load(config, std::move(ckpt)));
  auto impl = std::make_unique<Impl>();
  RETURN_IF_ERROR(impl->Init(config, &loaded->weights(), 0, options));
  return std::unique_ptr<CudaDeepseekModel>(new CudaDeepseekModel(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<CudaDeepseekModel>> CudaDeepseekModel::CreateGenerated(const std::string& config_json,
                                                                                      uint64_t seed,
                                                                                      const LoadOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(config_json));
  // A make-model --mtp-acceptance checkpoint (config.json records the construction): its
  // weights as that construction sets them.
  std::unique_ptr<MtpTestWeights> test;
  absl::StatusOr<MtpTestModelSpec> spec = ReadMtpTestModelSpec(config_json);
  if (spec.ok()) {
    test = std::make_unique<MtpTestWeights>(*spec, config);
  } else if (spec.status().code() != absl::StatusCode::kNotFound) {
    return spec.status();
  }
  auto impl = std::make_unique<Impl>();
  RETURN_IF_ERROR(impl->Init(config, nullptr, seed, options, test.get()));
  return std::unique_ptr<CudaDeepseekModel>(new CudaDeepseekModel(std::move(impl)));
}

const ModelConfig& CudaDeepseekModel::config() const { return impl_->config; }
std::string CudaDeepseekModel::device_name() const { return impl_->device_name; }
int64_t CudaDeepseekModel::num_blocks() const { return impl_->num_blocks; }
int64_t CudaDeepseekModel::max_context() const { return impl_->max_context; }
uint64_t CudaDeepseekModel::weight_bytes() const { return impl_->weights->bytes; }
uint64_t CudaDeepseekModel::kv_cache_bytes() const { return impl_->kv_bytes; }
uint64_t CudaDeepseekModel::activation_bytes() const { return impl_->activation_bytes; }
int64_t CudaDeepseekModel::fp8_linears() const {
  return impl_->options.fp8_decode && !impl_->options.batch_invariant ? impl_->weights->fp8_linears : 0;
}
uint64_t CudaDeepseekModel::fp8_weight_bytes() const { return impl_->weights->fp8_bytes; }
int64_t CudaDeepseekModel::fp8_gemms() const { return impl_->fp8_gemms_; }

absl::StatusOr<std::vector<float>> CudaDeepseekModel::Forward(std::span<const ForwardSequence> batch,
                                                              const DeepseekForwardOptions& options) {
  std::vector<float> logits;
  RETURN_IF_ERROR(impl_->Run(batch, options, &logits, nullptr));
  return logits;
}

absl::StatusOr<std::vector<int32_t>> CudaDeepseekModel::ForwardGreedy(std::span<const ForwardSequence> batch,
                                                                      const DeepseekForwardOptions& options) {
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(impl_->Run(batch, options, nullptr, &ids));
  return ids;
}

absl::StatusOr<std::vector<int32_t>> CudaDeepseekModel::ForwardSample(std::span<const ForwardSequence> batch,
                                                                      std::span<const SampleRow> rows,
                                                                      const DeepseekForwardOptions& options) {
  std::vector<int32_t> ids;
  if (rows.empty()) {
    // Only a batch without logits rows has nothing to sample (Run checks the count).
    RETURN_IF_ERROR(impl_->Run(batch, options, nullptr, &ids));
    if (!ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("0 sampling rows for ", ids.size(), " logits rows"));
    }
    return ids;
  }
  RETURN_IF_ERROR(impl_->Run(batch, options, nullptr, &ids, rows));
  return ids;
}

absl::Status CudaDeepseekModel::LaunchSample(std::span<const ForwardSequence> batch, std::span<const SampleRow> rows,
                                             const DeepseekForwardOptions& options) {
  if (impl_->launched_) return absl::FailedPreconditionError("a launched step was not collected");
  std::vector<int32_t> ids;
  const absl::Status st = rows.empty() ? absl::InvalidArgumentError("no sampling rows")
                                       : impl_->Run(batch, options, nullptr, &ids, rows, /*launch=*/true);
  if (!st.ok()) {
    impl_->launched_.reset();
    return st;
  }
  if (!impl_->launched_) impl_->launched_ = Impl::Launched{.tokens = std::move(ids)};  // ran to completion
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> CudaDeepseekModel::CollectSample() { return impl_->CollectLaunched(); }

absl::Status CudaDeepseekModel::ReadKvBlocks(int64_t layer, std::span<const int32_t> block_ids, float* host) {
  if (layer < 0 || layer >= impl_->kv_layers) return absl::InvalidArgumentError("layer out of range");
  for (int32_t b : block_ids) {
    if (b < 0 || b >= impl_->num_blocks) return absl::InvalidArgumentError(absl::StrCat("block id ", b, " out of range"));
  }
  const int64_t per_call = impl_->max_blocks_per_seq;  // the staging block table's capacity
  const int64_t entry = impl_->config.kv_entry_dim();
  for (size_t done = 0; done < block_ids.size(); done += per_call) {
    const size_t count = std::min<size_t>(per_call, block_ids.size() - done);
    RETURN_IF_ERROR(impl_->ReadKv(layer, block_ids.subspan(done, count), 0, static_cast<int64_t>(count) * kBlock,
                                  host + done * kBlock * entry));
  }
  return absl::OkStatus();
}

absl::Status CudaDeepseekModel::ReadKvEntries(int64_t layer, std::span<const int32_t> block_table,
                                              int64_t first_position, int64_t n, float* host) {
  if (layer < 0 || layer >= impl_->kv_layers) return absl::InvalidArgumentError("layer out of range");
  if (first_position < 0 || n < 0 || first_position + n > impl_->max_context ||
      static_cast<int64_t>(block_table.size()) * kBlock < first_position + n) {
    return absl::InvalidArgumentError("positions not covered by the block table or beyond max_context");
  }
  for (int32_t b : block_table.first((first_position + n + kBlock - 1) / kBlock)) {
    if (b < 0 || b >= impl_->num_blocks) return absl::InvalidArgumentError(absl::StrCat("block id ", b, " out of range"));
  }
  if (n == 0) return absl::OkStatus();
  return impl_->ReadKv(layer, block_table, first_position, n, host);
}

absl::Status CudaDeepseekModel::WriteKvEntries(int64_t layer, std::span<const int32_t> block_table,
                                               int64_t first_position, const float* entries, int64_t n) {
  if (layer < 0 || layer >= impl_->kv_layers) return absl::InvalidArgumentError("layer out of range");
  if (first_position < 0 || n < 0 || static_cast<int64_t>(block_table.size()) * kBlock < first_position + n) {
    return absl::InvalidArgumentError("positions not covered by the block table");
  }
  for (int32_t b : block_table.first((first_position + n + kBlock - 1) / kBlock)) {
    if (b < 0 || b >= impl_->num_blocks) return absl::InvalidArgumentError(absl::StrCat("block id ", b, " out of range"));
  }
  if (n == 0) return absl::OkStatus();
  return impl_->WriteKv(layer, block_table, first_position, entries, n);
}

absl::StatusOr<uint64_t> CudaDeepseekModel::LastForwardWeightBytes() { return impl_->LastForwardWeightBytes(); }
void CudaDeepseekModel::set_cuda_graphs(bool on) { impl_->graphs_on_ = on; }
void CudaDeepseekModel::set_programmatic_launch(bool on) { impl_->SetOption(&LoadOptions::programmatic_launch, on); }
void CudaDeepseekModel::set_fused_decode_max_tokens(int64_t tokens) {
  impl_->SetOption(&LoadOptions::fused_decode_max_tokens, tokens);
}
void CudaDeepseekModel::set_moe_expert_gemv(bool on) { impl_->SetOption(&LoadOptions::moe_expert_gemv, on); }
void CudaDeepseekModel::set_deterministic_moe_down(bool on) {
  impl_->SetOption(&LoadOptions::deterministic_moe_down, on);
}
void CudaDeepseekModel::set_moe_shared_experts_early(bool on) {
  impl_->SetOption(&LoadOptions::moe_shared_experts_early, on);
}
void CudaDeepseekModel::set_split_decode_queries(bool on) { impl_->SetOption(&LoadOptions::split_decode_queries, on); }
void CudaDeepseekModel::set_fp8_decode(bool on) { impl_->SetOption(&LoadOptions::fp8_decode, on); }
void CudaDeepseekModel::set_fp8_prefill(bool on) { impl_->SetOption(&LoadOptions::fp8_prefill, on); }
void CudaDeepseekModel::set_fp8_tensor_cores(bool on) { impl_->SetOption(&LoadOptions::fp8_tensor_cores, on); }
void CudaDeepseekModel::set_step_events(bool on) { impl_->step_events_ = on; }
absl::StatusOr<std::vector<std::pair<double, double>>> CudaDeepseekModel::TakeStepTimes() {
  return impl_->TakeStepTimes();
}
void CudaDeepseekModel::set_profiling(bool on) { impl_->profiling_ = on; }
void CudaDeepseekModel::set_kernel_timeline(bool on) { impl_->timeline_ = on; }
absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaDeepseekModel::TakeKernelTimeline() {
  return impl_->TakeKernelTimeline();
}
absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaDeepseekModel::TakeProfile() {
  return impl_->TakeProfile();
}
absl::Status CudaDeepseekModel::Synchronize() {
  return cuda_model::CudaStatus(cudaStreamSynchronize(impl_->stream), "synchronizing");
}
void* CudaDeepseekModel::stream() const { return impl_->stream; }
CudaDeepseekModel::KvPool CudaDeepseekModel::kv_pool() const {
  const Impl& m = *impl_;
  return {.base = m.kv_cache_base(), .bytes = m.kv_bytes, .num_layers = m.kv_layers,
          .num_blocks = m.num_blocks, .entry_bytes = m.config.kv_entry_dim() * 2,
          .max_blocks_per_seq = m.max_blocks_per_seq, .device = m.options.device};
}

}  // namespace tandem
