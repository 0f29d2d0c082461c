// DeepSeek-V4's weights on the GPU in the layouts the CUDA forward pass (cuda_v4_model.h)
// reads. FP8 matrices (128 x 128 block scales) stay FP8, FP4 experts (e2m1, a
// power-of-two scale per 32) stay FP4 and bf16 matrices stay bf16: decode-sized products
// read them through the narrow GEMV, larger ones widen slabs of rows into a scratch matrix
// first (the CPU engine's exact values either way). Everything else (float32 checkpoints,
// the embedding, vectors) is float32, so that the GPU computes what the CPU engine
// computes but for the order of its sums. Matrices that
// read the same input are stacked into one, one product for all:
//   - x_proj:  [q_a (q_lora) | kv (head_dim)] and [compressor kv, gate (2 x proj) |
//               indexer compressor kv, gate (2 x 2 index_head_dim)], one output row
//   - experts: gate and up stacked ([2 I][D]: the clamped SwiGLU's two halves), down.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/cuda/device_memory.h"
#include "engine/model/deepseek_v4/v4_config.h"
#include "engine/model/deepseek_v4/v4_weights.h"
#include "kernels/cuda/quantized_gemv.h"

namespace tandem::v4::cuda_v4 {

// Float32 (data), or narrow (codes and scales in `format`, as kernels/cuda/quantized_gemv.h
// reads them: FP8 [rows][cols] with [ceil(rows / 128)][ceil(cols / 128)] scales, FP4
// [rows][cols / 2] with [rows][cols / 32] power-of-two scales, bf16 [rows][cols] without).
struct DeviceMatrix {
  const float* data = nullptr;
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  cuda::QuantizedWeight format = cuda::QuantizedWeight::kFp8Block128;
  int64_t rows = 0;
  int64_t cols = 0;
  bool narrow() const { return codes != nullptr; }
};

struct HyperSite {
  DeviceMatrix fn;               // [(2 + n) n][n D] (the head's: [n][n D])
  const float* base = nullptr;   // device
  const float* scale = nullptr;  // device
};

// Column offsets into x_proj's output row.
struct XProjColumns {
  int64_t q_a = 0, kv = 0, compressor = -1, indexer_compressor = -1;
  int64_t width = 0;
};

struct CompressorParams {
  const float* position_bias = nullptr;  // [rate][proj_width]
  const float* norm = nullptr;           // [width]
};

struct ExpertMatrices {
  DeviceMatrix gate_up;  // [2 I][D]
  DeviceMatrix down;     // [D][I]
};

// One of the matrices the attention input is multiplied by, writing columns [col, col +
// rows) of x_proj's output row: matrices of one stored form stacked, so that FP8 ones
// stay FP8 beside the compressors' bf16.
struct XProjPart {
  DeviceMatrix matrix;
  int64_t col = 0;
};

struct CudaV4Layer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  HyperSite attn_hc, ffn_hc;
  std::vector<XProjPart> x_proj;
  XProjColumns x_cols;
  const float* q_a_norm = nullptr;
  const float* kv_norm = nullptr;
  DeviceMatrix q_b;            // [H d][q_lora]
  DeviceMatrix index_q_b;      // CSA: [index heads x index dim][q_lora]
  DeviceMatrix index_weights;  // CSA: [index heads][D]
  DeviceMatrix o_a;      // [G R][H d / G]: group g's rows g R .. (float32), or
  std::vector<DeviceMatrix> o_a_groups;  // each group's [R][H d / G] where all are FP8
  // The FP8 groups as the routed GEMV's table (group g = "expert" g): one launch for all
  // groups of a one-row pass.
  const cuda::QuantizedMatrixRef* o_a_table = nullptr;
  DeviceMatrix o_b;      // [D][G R]
  const float* sinks = nullptr;
  CompressorParams compressor, indexer_compressor;
  DeviceMatrix router;                     // [E][D]
  const float* correction_bias = nullptr;  // [E] or null (hash layers)
  const int32_t* tid2eid = nullptr;        // [vocab][K] or null
  std::vector<ExpertMatrices> experts;
  ExpertMatrices shared;
  // Where every routed expert is narrow (gate_up in one format, down in one): their
  // matrices as device tables,
  // for the routed GEMV (decode steps route on the device, no host round trip); else null.
  const cuda::QuantizedMatrixRef* gate_up_table = nullptr;  // [E]
  const cuda::QuantizedMatrixRef* down_table = nullptr;     // [E]
  cuda::QuantizedWeight gate_up_format = cuda::QuantizedWeight::kFp4Group32;
  cuda::QuantizedWeight down_format = cuda::QuantizedWeight::kFp4Group32;
};

struct CudaV4Weights {
  DeviceMatrix embed;  // [vocab][D]
  DeviceMatrix head;   // [vocab][D]
  const float* norm = nullptr;
  HyperSite hc_head;
  std::vector<CudaV4Layer> layers;
  uint64_t bytes = 0;
  int64_t fp8_matrices = 0;
  int64_t fp4_matrices = 0;
  int64_t bf16_matrices = 0;
  bool experts_routed_on_device = false;  // every layer has the routed GEMV's tables
  const int32_t* iota = nullptr;  // device [0, 1, ..., 63]: the o_a groups' "expert" ids
  int64_t max_narrow_elements = 0;  // the largest narrow matrix (bounds the widening scratch)
  int64_t max_fp8_cols = 0;         // the widest FP8 matrix's input (bounds the FP8 GEMM's scratch)
  std::vector<cuda_model::DeviceBuffer> buffers;
};

// Uploads `w` (of `config`) to the current device. Errors: RESOURCE_EXHAUSTED when the
// GPU lacks memory, INTERNAL for CUDA failures.
absl::StatusOr<std::unique_ptr<CudaV4Weights>> UploadV4Weights(const DeepseekV4Config& config,
                                                                const ModelWeights& w);

}  // namespace tandem::v4::cuda_v4
