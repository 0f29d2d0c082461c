// DeepSeek-V4's MoE layer on the GPU (CudaV4Model::Moe and its two paths).
#include <algorithm>
#include <vector>

#include "engine/model/deepseek_v4/cuda/cuda_v4_step.h"
#include "kernels/cuda/clamped_swiglu.h"
#include "kernels/cuda/quantized_gemv.h"
#include "kernels/cuda/v4_moe_routing.h"
#include "kernels/cuda/weighted_row_sum.h"

namespace tandem::v4::cuda_v4 {

using step_detail::Kernel;
using step_detail::Rebase;
using step_detail::RunCopies;
using step_detail::kDeviceRoutedProblems;

absl::Status CudaV4Model::Moe(int64_t layer) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows, d = c.hidden_size, k = c.num_experts_per_tok, inter = c.moe_intermediate_size;
  const int64_t e = c.n_routed_experts;
  const float limit = static_cast<float>(c.swiglu_limit);
  // The shared expert reads only u: on the side stream, beside the routing and the routed
  // experts, when the routed experts stay on the device (RoutedOnDevice joins it).
  if (shared_beside_on_ && lw.down_table != nullptr && rows * k <= kDeviceRoutedProblems &&
      SharedExpertBeside(layer)) {
    TANDEM_CUDA_RETURN(cudaEventRecord(fork_, stream_), "forking the shared expert");
    TANDEM_CUDA_RETURN(cudaStreamWaitEvent(side_stream_, fork_, 0), "forking the shared expert");
    RETURN_IF_ERROR(SharedExpert(layer, side_stream_));
    TANDEM_CUDA_RETURN(cudaEventRecord(join_, side_stream_), "joining the shared expert");
    st.shared_beside = true;
    ++shared_expert_branches_;
  } else {
    st.shared_beside = false;
  }
  RETURN_IF_ERROR(Linear(st.u, d, lw.router, st.router, e, rows));
  RETURN_IF_ERROR(Kernel(cuda::V4MoeRouting({.logits = st.router, .logits_stride = e,
                                             .num_tokens = static_cast<int>(rows), .num_experts = static_cast<int>(e),
                                             .top_k = static_cast<int>(k), .correction_bias = lw.correction_bias,
                                             .tid2eid = lw.tid2eid, .tokens = lw.tid2eid ? st.tokens : nullptr,
                                             .vocab_size = c.vocab_size, .bad_input = st.bad,
                                             .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
                                             .expert_ids = st.route_ids, .weights = st.route_w},
                                            stream_),
                         "the routing"));
  if (lw.down_table != nullptr && rows * k <= kDeviceRoutedProblems) return RoutedOnDevice(layer);
  // Which rows each expert takes: read back (the host round trip of larger passes and of
  // float32 experts).
  int32_t* ids = st.host_ids.get<int32_t>();
  TANDEM_CUDA_RETURN(cudaMemcpyAsync(ids, st.route_ids, static_cast<size_t>(rows * k) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_),
                     "reading the routing");
  TANDEM_CUDA_RETURN(cudaStreamSynchronize(stream_), "reading the routing");
  std::vector<int64_t> count(static_cast<size_t>(e) + 1, 0), offset(static_cast<size_t>(e) + 1, 0);
  for (int64_t i = 0; i < rows * k; ++i) {
    if (ids[i] >= 0 && ids[i] < e) ++count[static_cast<size_t>(ids[i])];
  }
  for (int64_t x = 0; x < e; ++x) offset[static_cast<size_t>(x) + 1] = offset[static_cast<size_t>(x)] + count[static_cast<size_t>(x)];
  std::vector<int64_t> next(offset.begin(), offset.end() - 1);
  st.moe_src.assign(static_cast<size_t>(offset[static_cast<size_t>(e)]), nullptr);
  st.moe_dst.assign(st.moe_src.size(), nullptr);
  st.moe_rows.assign(static_cast<size_t>(rows * k), nullptr);
  for (int64_t i = 0; i < rows * k; ++i) {
    if (ids[i] < 0 || ids[i] >= e) continue;
    const int64_t at = next[static_cast<size_t>(ids[i])]++;
    st.moe_src[static_cast<size_t>(at)] = st.u + (i / k) * d;
    st.moe_dst[static_cast<size_t>(at)] = st.gathered + at * d;
    st.moe_rows[static_cast<size_t>(i)] = st.expert_out + at * d;
  }
  const float* const* dsrc = st.moe_staging.Add(st.moe_src);
  float* const* ddst = st.moe_staging.Add(st.moe_dst);
  const float* const* drows = st.moe_staging.Add(st.moe_rows);
  ASSIGN_OR_RETURN(const std::byte* base, st.moe_staging.Upload(stream_));
  dsrc = Rebase(dsrc, base);
  ddst = Rebase(ddst, base);
  drows = Rebase(drows, base);
  const int64_t routed = offset[static_cast<size_t>(e)];
  RETURN_IF_ERROR(RunCopies(dsrc, nullptr, ddst, routed, d, stream_, "gathering the experts' rows"));
  for (int64_t x = 0; x < e; ++x) {
    const int64_t m = count[static_cast<size_t>(x)], at = offset[static_cast<size_t>(x)];
    if (m == 0) continue;
    RETURN_IF_ERROR(Linear(st.gathered + at * d, d, lw.experts[static_cast<size_t>(x)].gate_up,
                           st.hidden + at * 2 * inter, 2 * inter, m));
  }
  for (int64_t r0 = 0; r0 < routed; r0 += 65535) {
    const int64_t m = std::min<int64_t>(65535, routed - r0);
    RETURN_IF_ERROR(Kernel(cuda::ClampedSwiGlu({.x = st.hidden + r0 * 2 * inter, .x_stride = 2 * inter, .rows = m,
                                                .cols = inter, .limit = limit, .out = st.act + r0 * inter,
                                                .out_stride = inter},
                                               stream_),
                           "the experts' activation"));
  }
  for (int64_t x = 0; x < e; ++x) {
    const int64_t m = count[static_cast<size_t>(x)], at = offset[static_cast<size_t>(x)];
    if (m == 0) continue;
    RETURN_IF_ERROR(Linear(st.act + at * inter, inter, lw.experts[static_cast<size_t>(x)].down, st.expert_out + at * d,
                           d, m));
  }
  return SharedExpertAndCombine(layer, drows);
}

// Decode-sized passes with narrow experts: each (token, slot) a problem of the routed
// GEMV, which reads the routing's expert ids on the device.
absl::Status CudaV4Model::RoutedOnDevice(int64_t layer) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows, d = c.hidden_size, k = c.num_experts_per_tok, inter = c.moe_intermediate_size;
  const int problems = static_cast<int>(rows * k);
  const float limit = static_cast<float>(c.swiglu_limit);
  RETURN_IF_ERROR(Kernel(cuda::QuantizedGemv({.format = lw.gate_up_format, .x = st.u, .ldx = d, .y = st.hidden,
                                              .ldy = 2 * inter, .m = 1, .n = 2 * inter, .k = d,
                                              .experts = lw.gate_up_table,
                                              .num_experts = static_cast<int>(c.n_routed_experts),
                                              .ids = st.route_ids, .problems = problems, .x_group = static_cast<int>(k)},
                                             stream_),
                         "the routed experts' gate and up projections"));
  RETURN_IF_ERROR(Kernel(cuda::ClampedSwiGlu({.x = st.hidden, .x_stride = 2 * inter, .rows = problems, .cols = inter,
                                              .limit = limit, .out = st.act, .out_stride = inter},
                                             stream_),
                         "the experts' activation"));
  RETURN_IF_ERROR(Kernel(cuda::QuantizedGemv({.format = lw.down_format, .x = st.act, .ldx = inter,
                                              .y = st.expert_out, .ldy = d, .m = 1, .n = d, .k = inter,
                                              .experts = lw.down_table,
                                              .num_experts = static_cast<int>(c.n_routed_experts),
                                              .ids = st.route_ids, .problems = problems, .x_group = 1},
                                             stream_),
                         "the routed experts' down projections"));
  return SharedExpertAndCombine(layer, st.routed_rows);
}

bool CudaV4Model::SharedExpertBeside(int64_t layer) const {
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const int64_t rows = step_->rows;
  auto narrow_gemv = [&](const DeviceMatrix& w) {
    return w.narrow() && rows <= cuda::kQuantizedGemvMaxRows &&
           cuda::QuantizedGemvSharedBytes(rows, w.cols) <= cuda::kQuantizedGemvMaxSharedBytes;
  };
  return narrow_gemv(lw.shared.gate_up) && narrow_gemv(lw.shared.down);
}

absl::Status CudaV4Model::SharedExpert(int64_t layer, cudaStream_t stream) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const CudaV4Layer& lw = weights_->layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows, d = c.hidden_size, inter = c.moe_intermediate_size;
  if (stream == stream_) {
    RETURN_IF_ERROR(Linear(st.u, d, lw.shared.gate_up, st.shared_hidden, 2 * inter, rows));
  } else {  // (SharedExpertBeside: a narrow GEMV, no scratch shared with the main stream)
    const DeviceMatrix& w = lw.shared.gate_up;
    RETURN_IF_ERROR(Kernel(cuda::QuantizedGemv({.format = w.format, .w = w.codes, .scales = w.scales, .x = st.u,
                                                .ldx = d, .y = st.shared_hidden, .ldy = 2 * inter,
                                                .m = static_cast<int>(rows), .n = w.rows, .k = w.cols},
                                               stream),
                           "the shared expert's gate and up projections"));
  }
  RETURN_IF_ERROR(Kernel(cuda::ClampedSwiGlu({.x = st.shared_hidden, .x_stride = 2 * inter, .rows = rows,
                                              .cols = inter, .limit = static_cast<float>(c.swiglu_limit),
                                              .out = st.shared_act, .out_stride = inter},
                                             stream),
                         "the shared expert's activation"));
  if (stream == stream_) return Linear(st.shared_act, inter, lw.shared.down, st.sub, d, rows);
  const DeviceMatrix& w = lw.shared.down;
  return Kernel(cuda::QuantizedGemv({.format = w.format, .w = w.codes, .scales = w.scales, .x = st.shared_act,
                                     .ldx = inter, .y = st.sub, .ldy = d, .m = static_cast<int>(rows), .n = w.rows,
                                     .k = w.cols},
                                    stream),
                "the shared expert's down projection");
}

// The shared expert of every row into sub (or its branch joined, when it ran beside the
// routed experts), then the routed outputs (`routed`: a row per token and slot, null for
// none) weighted and added to it.
absl::Status CudaV4Model::SharedExpertAndCombine(int64_t layer, const float* const* routed) {
  const DeepseekV4Config& c = config_;
  Step& st = *step_;
  const int64_t rows = st.rows, d = c.hidden_size;
  if (st.shared_beside) {
    TANDEM_CUDA_RETURN(cudaStreamWaitEvent(stream_, join_, 0), "joining the shared expert");
  } else {
    RETURN_IF_ERROR(SharedExpert(layer, stream_));
  }
  return Kernel(cuda::WeightedRowSum({.rows = routed, .weights = st.route_w,
                                      .k = static_cast<int>(c.num_experts_per_tok), .tokens = rows, .width = d,
                                      .add = st.sub, .add_stride = d, .out = st.sub, .out_stride = d},
                                     stream_),
                "combining the experts");
}

}  // namespace tandem::v4::cuda_v4
