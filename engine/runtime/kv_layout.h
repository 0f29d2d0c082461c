// The KV layout a model's replicas exchange (DESIGN.md §2, §4): which model, element type,
// block size and entry size. Its fingerprint travels with every request that moves KV, so
// replicas of different builds or models never exchange KV silently. The router computes
// it from the checkpoint's config.json without loading weights.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/runtime/block_hash.h"

namespace tandem {

// Bump when the meaning of KV bytes changes (entry layout, RoPE placement, dtype rules).
inline constexpr int32_t kKvLayoutVersion = 1;

// The layout of `model_dir`'s KV as this build stores it (float32 entries of
// kv_lora_rank + qk_rope_head_dim, blocks of 64 tokens).
absl::StatusOr<KvLayout> KvLayoutForModel(const std::string& model_dir);
KvLayout KvLayoutFor(const ModelConfig& config, const std::string& config_json_text);

}  // namespace tandem
